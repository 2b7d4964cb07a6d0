"""The reward model's role in the plan: the same dtype and attention rules as the other roles, host
offload from upstream's `free_cache_engine`, rows per forward from the policy's log-prob micro-batch."""
import pytest
from test_planner import FULL, PLAIN, QWEN05, config

from verl.compat import format_plan
from verl.compat.device.catalog import get_profile
from verl.compat.planning.planner import make_plan
from verl.compat.planning.reward_model import rm_setting
from verl.trainer.config_check import load_config

# micro-batches every load_config needs, left to compat
AUTO_MICRO = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=auto", "critic.ppo_micro_batch_size_per_gpu=auto",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=auto"]
RM = {"reward__reward_model__enable": True, "reward__reward_model__model_path": "/rm"}


def plan_for(device, software=PLAIN, **extra):
    return make_plan(get_profile(device), config(64, 256, 256, 16, 4, 8, **{**RM, **extra}), software, QWEN05)


def test_no_reward_model_role_unless_enabled():
    plan = make_plan(get_profile("h200"), config(64, 256, 256, 16, 4, 8), FULL, QWEN05)
    assert plan.reward_model is None
    assert "\n  rm " not in format_plan(plan)


@pytest.mark.parametrize("device,compute,param,guard", [
    ("cpu", "float32", "float32", False),
    ("p40", "float32", "float32", False),
    ("t4", "float16", "float32", True),     # float16 guarded: float32 weights to compare against
    ("h200", "bfloat16", "bfloat16", False),  # frozen: kept in its compute dtype
])
def test_dtype_follows_the_device_as_for_the_reference(device, compute, param, guard):
    rm = plan_for(device).reward_model
    assert (rm.compute_dtype, rm.param_dtype, rm.numerics_guard) == (compute, param, guard)
    assert not rm.use_remove_padding and not rm.fsdp and not rm.grad_scaler and not rm.use_dynamic_bsz


def test_user_dtype_and_free_cache_engine_are_honoured():
    rm = plan_for("h200", reward__reward_model__rollout={"dtype": "float32", "free_cache_engine": False}).reward_model
    assert rm.compute_dtype == "float32" and rm.param_offload is False
    assert plan_for("h200").reward_model.param_offload is True     # upstream's default free_cache_engine=true
    assert plan_for("cpu").reward_model.param_offload is False     # host memory already


def test_micro_batch_is_the_log_prob_micro_batch_capped_by_max_num_seqs():
    plan = plan_for("h200")
    assert plan.reward_model.micro_batch_size_per_gpu == (plan.ref or plan.actor).forward_micro_batch_size_per_gpu
    capped = plan_for("h200", reward__reward_model__rollout={"max_num_seqs": 1}).reward_model
    assert capped.micro_batch_size_per_gpu == 1
    assert "max_num_seqs=1" in plan_for("h200", reward__reward_model__rollout={"max_num_seqs": 1}).reasons[
        "reward_model.micro_batch_size_per_gpu"]


def test_legacy_keys_are_migrated_as_upstream_does():
    cfg = load_config(["reward_model.enable=True", "reward_model.model.path=/some/rm",
                       "reward_model.rollout.dtype=float16", *AUTO_MICRO])
    assert cfg.reward.reward_model.enable is True
    assert cfg.reward.reward_model.model_path == "/some/rm"
    assert cfg.reward.reward_model.rollout.dtype == "float16"
    assert rm_setting(cfg, "model_path") == "/some/rm"
    assert make_plan(get_profile("t4"), cfg, PLAIN, QWEN05).reward_model.compute_dtype == "float16"


def test_enable_without_a_path_names_the_key():
    from verl.trainer.config_check import ConfigError

    with pytest.raises(ConfigError, match="set reward.reward_model.model_path"):
        load_config(["reward.reward_model.enable=True", *AUTO_MICRO])
