"""The host-memory check of offloaded plans: what FSDP2's CPU offload keeps in RAM, and the refusal."""
import pytest

from verl.compat.planning.decider import MemoryShortfall
from verl.compat.planning.host_memory import check_host_memory, host_state_gb
from verl.compat.planning.memory import GiB
from verl.compat.planning.model_spec import BUILTIN_MODELS, ModelSpec
from verl.compat.plan import RolePlan

Q7 = ModelSpec.from_hf_config(BUILTIN_MODELS["qwen2.5-7b"])


def role(offload=True, dtype="float32", lora=0, eight_bit=False):
    return RolePlan(param_dtype=dtype, compute_dtype="bfloat16", grad_scaler=False, attn_implementation="sdpa",
                    use_remove_padding=False, gradient_checkpointing=True, param_offload=offload,
                    optimizer_offload=offload, lora_rank=lora, optimizer_8bit=eight_bit)


def test_offloaded_full_training_keeps_weights_grads_and_adam_moments_on_the_host():
    # float32 weights + gradients (8 B) and two float32 moments (8 B) per parameter; a frozen ref only its weights
    assert host_state_gb(Q7, {"actor": role()}) == pytest.approx(Q7.num_params * 16 / GiB)
    assert host_state_gb(Q7, {"ref": role(dtype="bfloat16")}) == pytest.approx(Q7.num_params * 2 / GiB)
    assert host_state_gb(Q7, {"actor": role()}, nnodes=2) == pytest.approx(Q7.num_params * 8 / GiB)
    assert host_state_gb(Q7, {"actor": role(offload=False)}) == 0.0


def test_a_7b_offload_is_refused_on_a_128_gib_host_and_passes_on_a_larger_one():
    with pytest.raises(MemoryShortfall, match=r"needs about 116.5 GiB per node .* this host has 125.0 GiB"):
        check_host_memory(125.0, Q7, {"actor": role()}, ranks_per_node=1)
    check_host_memory(256.0, Q7, {"actor": role()}, ranks_per_node=1)
    check_host_memory(0.0, Q7, {"actor": role()}, ranks_per_node=1)      # unknown host: not checked


def test_the_planner_refuses_an_a100_7b_offload_on_a_128_gib_host_and_plans_it_on_a_larger_one():
    """The a100-40gb 7B full cell: the device fits with offload, the H200 test host's RAM does not."""
    import dataclasses

    from verl.compat.device.catalog import CATALOG
    from verl.compat.planning.planner import make_plan
    from verl.compat.device.profile import SoftwareInfo
    from verl.trainer.config_check import load_config

    config = load_config(["algorithm.adv_estimator=grpo", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
                          "data.max_prompt_length=256", "data.max_response_length=256",
                          "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.use_kl_loss=true",
                          "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.rollout.name=hf",
                          "trainer.n_gpus_per_node=1", "trainer.nnodes=1"])
    software = SoftwareInfo(torch_version="2.11.0", triton_usable=True)
    small_host = dataclasses.replace(CATALOG["a100-40gb"], host_memory_gb=125.0)
    with pytest.raises(MemoryShortfall, match="offloads actor to host memory"):
        make_plan(small_host, config, software, Q7)
    plan = make_plan(dataclasses.replace(small_host, host_memory_gb=256.0), config, software, Q7)
    assert plan.actor.param_offload and plan.actor.optimizer_offload
