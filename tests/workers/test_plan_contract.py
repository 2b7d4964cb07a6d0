"""The plan-to-worker contract: for every catalog device and three algorithms, the real planner's
plan drives the real workers through one full training step.

Each case composes the stock config as `main_ppo` does, plans for the catalog device with
`verl.compat.build_plan` (the device simulated, the software what this host has), writes the plan
into the config (`resolve_config`), and runs it on this host's CPU through
`verl.compat.apply.apply_plan.on_host_cpu`: every numerics decision stays the device's (float16 with a grad
scaler and the numerics guard on Volta/Turing, bfloat16 from Ampere, float32 on Pascal), while
the device type, collective backend, GPU-only attention kernels and torch.compile are replaced
(torch's CPU autocast runs float16 and bfloat16, so no dtype needs a stand-in). Memory figures
are not checked here (a CPU cannot measure a GPU's), only that every step runs on the plan and
that the workers applied exactly what it says.

Then one training step in the trainer's order: generate, old log-probs, reference log-probs,
values, reward (KL in reward where asked), advantages, critic update, actor update.
"""
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import PROMPT_LEN, RESPONSE_LEN, tiny_model  # noqa: E402

from verl.compat.device.catalog import CATALOG  # noqa: E402
from verl.protocol import DataProto  # noqa: E402

torch.set_num_threads(1)

ALGORITHMS = {
    "ppo_gae": ["algorithm.adv_estimator=gae"],
    "grpo_kl_loss": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True"],
    "reinforce_pp_kl_reward": ["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.use_kl_in_reward=True"],
}
# What each device computes in (the planner's rule, restated so a wrong plan cannot pass).
EXPECTED_COMPUTE = {"cpu": "float32", "p40": "float32", "p100": "float32", "v100-16gb": "float16",
                    "v100-32gb": "float16", "t4": "float16", "rtx2080ti": "float16"}
PROMPTS, N = 2, 2
MICRO_BATCH_KEYS = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",   # compat picks them
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
                    "critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2_contract")))


def _config(model_dir: str, device: str, algorithm: str, *extra: str):
    from verl.trainer.config_check import load_config

    return load_config([
        f"actor_rollout_ref.model.path={model_dir}", f"critic.model.path={model_dir}",
        f"data.train_batch_size={PROMPTS}", f"data.max_prompt_length={PROMPT_LEN}",
        f"data.max_response_length={RESPONSE_LEN}", f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
        f"actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.actor.optim.lr=1e-3", "critic.optim.lr=1e-3",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", f"compat.device={device}",
        *[f"{key}=auto" for key in MICRO_BATCH_KEYS],
        *ALGORITHMS[algorithm], *extra,
    ])


def _plan(config):
    from verl import compat
    from verl.compat.apply.apply_plan import on_host_cpu

    plan = on_host_cpu(compat.build_plan(config, to_run=False))
    compat.resolve_config(config, plan)
    return plan


def _prompts(vocab: int) -> DataProto:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (PROMPTS, PROMPT_LEN), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0                                     # a left-padded prompt
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids})


def _take(output: DataProto, updates: list) -> DataProto:
    """What the trainer does with a worker's output meta: plan updates out, metrics out."""
    from verl.trainer.ppo.ray_trainer import _pop_metrics

    updates.extend(output.meta_info.pop("compat_plan_updates", None) or [])
    output.meta_info["step_metrics"] = _pop_metrics(output)
    return output


def _rewards(batch: DataProto) -> torch.Tensor:
    """A rule reward at each response's last real token: the share of even token ids."""
    responses, mask = batch.batch["responses"], batch.batch["response_mask"]
    score = ((responses % 2 == 0) & mask.bool()).sum(-1) / mask.sum(-1).clamp(min=1)
    out = torch.zeros_like(responses, dtype=torch.float32)
    last = (mask.sum(-1) - 1).clamp(min=0)
    out[torch.arange(len(out)), last] = score.float()
    return out


def _assert_applied(planned, module, role_plan, trained: bool = True) -> None:
    """The worker's model computes exactly as its role plan says; a frozen one (the reference) is stored
    in the plan's `frozen_dtype` where it sets one (float16 under float32 compute on a P40)."""
    from verl.compat import torch_dtype
    from verl.workers.model_building.loading import storage_dtype

    compute = torch_dtype(role_plan.compute_dtype)
    assert planned.precision.autocast_dtype == (None if compute == torch.float32 else compute)
    assert (planned.precision.scaler is not None) == role_plan.grad_scaler
    assert not planned.guard_pending                        # a guard the plan asked for has run
    assert {p.dtype for p in module.parameters()} == {torch_dtype(storage_dtype(role_plan, trained))}


def _one_step(config, plan, steps: int = 1, on_built=None):
    """Build the workers (`on_built(actor, critic)` then sees them) and run `steps` training steps."""
    from verl.trainer.config_check import need_critic, need_reference_policy
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    use_ref, use_critic = need_reference_policy(config), need_critic(config)
    actor = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor_rollout_ref" if use_ref else "actor_rollout",
                                  plan=plan)
    actor.init_model()
    critic = None
    if use_critic:
        critic = CriticWorker(config.critic, plan=plan)
        critic.init_model()
    if on_built is not None:
        on_built(actor, critic)
    updates: list = []
    for _ in range(steps):
        metrics = _train_step(config, actor, critic, use_ref, updates)
    return actor, critic, metrics, updates


def _train_step(config, actor, critic, use_ref, updates) -> dict:
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage, compute_response_mask

    use_critic = critic is not None
    prompts = _prompts(actor.actor_module.config.vocab_size)
    prompts.meta_info.update({"do_sample": True, "temperature": 1.0})
    batch = _take(actor.generate_sequences(prompts.repeat(N, interleave=True)), updates)
    batch.meta_info.clear()
    batch.non_tensor_batch["uid"] = np.repeat(np.array([f"p{i}" for i in range(PROMPTS)], dtype=object), N)
    if "response_mask" not in batch.batch.keys():
        batch.batch["response_mask"] = compute_response_mask(batch)
    batch.meta_info["temperature"] = 1.0

    old = _take(actor.compute_log_prob(batch), updates)
    old.batch.pop("entropys")
    batch = batch.union(DataProto.from_dict({"old_log_probs": old.batch["old_log_probs"]}))
    if use_ref:
        ref = _take(actor.compute_ref_log_prob(batch), updates)
        batch = batch.union(DataProto.from_dict({"ref_log_prob": ref.batch["ref_log_prob"]}))
    if use_critic:
        values = _take(critic.compute_values(batch), updates)
        batch = batch.union(DataProto.from_dict({"values": values.batch["values"]}))
    for key in ("old_log_probs", "ref_log_prob", "values"):
        if key in batch.batch.keys():
            assert batch.batch[key].dtype == torch.float32 and torch.isfinite(batch.batch[key]).all(), key

    algo = config.algorithm
    batch.batch["token_level_scores"] = _rewards(batch)
    if algo.use_kl_in_reward:
        batch, _ = apply_kl_penalty(batch, core_algos.get_kl_controller(algo.kl_ctrl), algo.kl_penalty)
    else:
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    batch = compute_advantage(batch, adv_estimator=algo.adv_estimator, gamma=algo.gamma, lam=algo.lam,
                              num_repeat=N, norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True),
                              config=algo)
    assert torch.isfinite(batch.batch["advantages"]).all()

    metrics = {}
    if use_critic:
        metrics.update(_take(critic.update_critic(batch), updates).meta_info["step_metrics"])
    metrics.update(_take(actor.update_actor(batch), updates).meta_info["step_metrics"])
    return metrics


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("device", sorted(CATALOG))
def test_every_catalog_device_plan_runs_a_training_step(model_dir, device, algorithm):
    config = _config(model_dir, device, algorithm)
    plan = _plan(config)
    assert plan.device.name == device and plan.device_type == "cpu"
    roles = {"actor": plan.actor, "critic": plan.critic, "ref": plan.ref}
    assert (plan.critic is not None) == (algorithm == "ppo_gae")
    assert (plan.ref is not None) == (algorithm != "ppo_gae")
    expected = EXPECTED_COMPUTE.get(device, "bfloat16")
    for name, rp in roles.items():
        if rp is not None:
            assert rp.compute_dtype == expected, name
            assert rp.numerics_guard == (expected == "float16"), name   # compat.numerics_guard defaults to on

    actor, critic, metrics, updates = _one_step(config, plan)

    assert updates == []          # the tiny model is healthy in every dtype: no fallback, the plan held
    models = {"actor": (actor._actor_model, actor.actor_module)}
    if plan.ref is not None:
        models["ref"] = (actor._ref_model, actor.ref_module)
    if critic is not None:
        models["critic"] = (critic._critic_model, critic.critic_module)
    for name, rp in roles.items():
        if rp is not None:
            _assert_applied(*models[name], rp, trained=name != "ref")
    for key in ("actor/pg_loss", "actor/kl_loss", "critic/vf_loss"):
        if key in metrics:
            assert np.isfinite(metrics[key]), key
    assert ("actor/kl_loss" in metrics) == (algorithm == "grpo_kl_loss")
    assert ("critic/vf_loss" in metrics) == (algorithm == "ppo_gae")


def test_an_offloaded_plan_runs_on_the_host(model_dir):
    """A float16 plan with both offloads asked for: optimizer offload is run as planned (host to host);
    param offload, which FSDP2 runs only with an accelerator, is replaced with its reason."""
    fsdp = "actor_rollout_ref.actor.fsdp_config"
    config = _config(model_dir, "t4", "grpo_kl_loss", f"{fsdp}.param_offload=True", f"{fsdp}.optimizer_offload=True")
    plan = _plan(config)
    assert plan.actor.optimizer_offload and not plan.actor.param_offload
    assert "host memory" in plan.reasons["actor.param_offload"] and "t4" in plan.reasons["actor.param_offload"]
    actor, _, metrics, updates = _one_step(config, plan)
    assert actor._actor_model.optimizer_offload and updates == []
    assert np.isfinite(metrics["actor/pg_loss"]) and np.isfinite(metrics["actor/kl_loss"])


def test_offloaded_optimizer_state_is_on_the_device_only_for_its_step(model_dir, monkeypatch):
    """The t4 PPO plan (optimizer offload for actor and critic, as the planner picks it for the GPU matrix's
    Qwen2.5-0.5B): the state is needed by `optimizer.step()` only, and the memory model counts it there.
    Brought to the device for the whole update instead, from step 2 on (once the state exists) it sat
    next to the update's activations: 13.25 GiB measured on the H200 against 9.51 at step 1 and 11.58
    predicted. A CPU host has no second device to find the state on, so where each move sends it is
    recorded (`keep_host_shards` marks the move to the compute device), and no forward, in any phase of
    two steps, may run while it is there; every step must still run with it there."""
    from verl.utils import fsdp_utils

    offload = ("actor_rollout_ref.actor.fsdp_config.optimizer_offload=True", "critic.fsdp.optimizer_offload=True")
    config = _config(model_dir, "t4", "ppo_gae", *offload)
    plan = _plan(config)
    assert plan.actor.optimizer_offload and plan.critic.optimizer_offload
    assert plan.actor.compute_dtype == plan.critic.compute_dtype == "float16"
    sent: dict[int, str] = {}      # id(optimizer) -> "device" | "host", where its state was last sent
    moves = fsdp_utils.move_optimizer_state

    store = fsdp_utils._PinnedHostState.store   # the move back to the host, into the reused host buffers

    def recorded_move(optimizer, device, *, keep_host_shards=False, non_blocking=False):
        sent[id(optimizer)] = "device" if keep_host_shards else "host"
        moves(optimizer, device, keep_host_shards=keep_host_shards, non_blocking=non_blocking)

    def recorded_store(self, optimizer):
        sent[id(optimizer)] = "host"
        store(self, optimizer)

    monkeypatch.setattr(fsdp_utils, "move_optimizer_state", recorded_move)
    monkeypatch.setattr(fsdp_utils._PinnedHostState, "store", recorded_store)
    seen = {"forward": [], "step": []}

    def watch(actor, critic):
        for name, module, optimizer in (("actor", actor.actor_module, actor.actor_optimizer),
                                        ("critic", critic.critic_module, critic.critic_optimizer)):
            module.register_forward_pre_hook(
                lambda *_, n=name, o=optimizer: seen["forward"].append((n, sent.get(id(o), "host"))))
            optimizer.register_step_pre_hook(   # registered after the worker's own hooks: runs after them
                lambda *_, n=name, o=optimizer: seen["step"].append((n, sent.get(id(o), "host"))))

    actor, critic, metrics, updates = _one_step(config, plan, steps=2, on_built=watch)
    assert updates == [] and np.isfinite(metrics["actor/pg_loss"]) and np.isfinite(metrics["critic/vf_loss"])
    assert {n for n, _ in seen["forward"]} == {"actor", "critic"} and len(seen["forward"]) > 8
    assert [where for _, where in seen["forward"] if where != "host"] == []
    assert sorted(seen["step"]) == [("actor", "device")] * 2 + [("critic", "device")] * 2
    assert sent == {id(actor.actor_optimizer): "host", id(critic.critic_optimizer): "host"}
