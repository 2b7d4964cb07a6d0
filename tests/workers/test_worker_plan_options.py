"""Plan options the workers must honour on CPU: rollout dtype, gradient checkpointing, offload.

Tolerances: gradient checkpointing recomputes the same float32 forward, so gradients agree to 1e-6.
"""
import dataclasses
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import (  # noqa: E402
    PROMPT_LEN,
    GradRecorder,
    actor_rollout_ref_config,
    cpu_plan,
    ppo_batch,
    role_plan,
    tiny_model,
)

from verl.protocol import DataProto  # noqa: E402
from verl.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2")))


def _actor(model_dir, plan, role="actor_rollout"):
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role=role, plan=plan)
    worker.init_model()
    return worker


def _plan(model_dir, rollout_dtype: str, **actor):
    plan = cpu_plan(model_dir, actor=role_plan(**actor))
    plan.rollout = dataclasses.replace(plan.rollout, dtype=rollout_dtype)
    return plan


def _prompts():
    data = ppo_batch(batch_size=4)
    return DataProto.from_dict({k: data.batch[k][:, :PROMPT_LEN] for k in ("input_ids", "attention_mask",
                                                                            "position_ids")})


def _generation_dtypes(worker) -> set:
    """(autocast dtype or None, weight dtype) at every pass of one generate_sequences call (each pass,
    the static decoder's or the HF forward's, embeds its tokens once)."""
    seen = []

    def record(module, *_):
        autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        seen.append((autocast, next(module.parameters()).dtype))

    hook = worker.actor_module.model.embed_tokens.register_forward_pre_hook(record)
    try:
        worker.generate_sequences(_prompts())
    finally:
        hook.remove()
    return set(seen)


# ------------------------------------------------------------------------------------ rollout dtype


def test_float32_rollout_over_a_half_precision_actor_generates_in_float32(model_dir):
    worker = _actor(model_dir, _plan(model_dir, "float32", compute_dtype="bfloat16"))
    # weights are gathered in float32 so the rollout can stay float32; training autocasts to the compute dtype
    assert not worker._actor_model.cast_on_gather
    assert worker._actor_model.precision.autocast_dtype == torch.bfloat16
    assert _generation_dtypes(worker) == {(None, torch.float32)}


def test_half_precision_rollout_over_a_float32_actor_autocasts(model_dir):
    worker = _actor(model_dir, _plan(model_dir, "bfloat16"))
    assert worker._actor_model.precision.autocast_dtype is None
    assert _generation_dtypes(worker) == {(torch.bfloat16, torch.float32)}


def test_rollout_follows_the_fp16_guard(model_dir, monkeypatch):
    import verl.compat.numerics as numerics

    fp16 = {"compute_dtype": "float16", "grad_scaler": True}
    passed = _actor(model_dir, _plan(model_dir, "float16", **fp16))
    passed.compute_log_prob(ppo_batch())   # the guard runs here, so its own forwards are not recorded below
    assert _generation_dtypes(passed) == {(torch.float16, torch.float32)}

    monkeypatch.setattr(numerics, "check_half_precision", lambda model, batch, dtype: (False, "forced in a test"))
    failed = _actor(model_dir, _plan(model_dir, "float16", **fp16))
    failed.compute_log_prob(ppo_batch())
    assert _generation_dtypes(failed) == {(None, torch.float32)}
    assert failed.rollout.dtype == torch.float32


# ------------------------------------------------------------------------------------ critic model


def test_value_head_has_no_dropout_in_train_mode(model_dir):
    """transformers' token classifiers default to dropout 0.1 before the head; a critic must not have it."""
    from verl.utils.model_loading import build_model

    critic = build_model(model_dir, role_plan(), value_head=True, train=True)
    assert critic.training
    assert all(m.p == 0.0 for m in critic.modules() if isinstance(m, torch.nn.Dropout))
    ids = ppo_batch(batch_size=2).batch["input_ids"]
    torch.testing.assert_close(critic(input_ids=ids).logits, critic(input_ids=ids).logits, atol=0, rtol=0)


# ------------------------------------------------------------------------------------ numerics guard switch


def test_numerics_guard_false_skips_the_check_and_casts_on_gather(model_dir, monkeypatch):
    """`compat.numerics_guard: false` reaches the worker as numerics_guard=False: no check, FSDP casts."""
    import verl.compat.numerics as numerics

    def never(*_):
        raise AssertionError("the numerics guard ran although numerics_guard=False")

    monkeypatch.setattr(numerics, "check_half_precision", never)
    plan = _plan(model_dir, "float16", compute_dtype="float16", grad_scaler=True)
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role="actor_rollout", plan=plan,
                                   numerics_guard=False)
    worker.init_model()
    assert not worker._actor_model.guard_pending and worker._actor_model.cast_on_gather
    log_probs = worker.compute_log_prob(ppo_batch()).batch["old_log_probs"]
    assert log_probs.dtype == torch.float32 and torch.isfinite(log_probs).all()


# ------------------------------------------------------------------------------------ gradient checkpointing




def _mlp_forward_calls(worker) -> list:
    """Forwards of the first layer's MLP (inside the checkpointed region, so recomputes show up)."""
    calls = []
    worker.actor_module.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def test_gradient_checkpointing_recomputes_and_gives_the_same_gradients(model_dir):
    data = ppo_batch()
    grads = {}
    for ckpt in (False, True):
        worker = _actor(model_dir, cpu_plan(model_dir, actor=role_plan(gradient_checkpointing=ckpt)), role="actor")
        assert worker.actor_module.is_gradient_checkpointing is ckpt
        batch = data.select(list(data.batch.keys()))
        batch.batch["old_log_probs"] = worker.compute_log_prob(batch).batch["old_log_probs"]
        recorder = GradRecorder(worker.actor_module.parameters())
        worker.actor.actor_optimizer = recorder
        calls = _mlp_forward_calls(worker)
        worker.actor.update_policy(batch)
        grads[ckpt] = recorder.grads
        # 8 sequences / mini-batch 4 (2 prompts x n=2) / micro-batch 2 -> 4 micro-batch forwards; checkpointing
        # runs each layer's inner modules again during backward
        assert len(calls) == (8 if ckpt else 4)
    assert len(grads[True]) == len(grads[False]) == 2
    for step_ckpt, step_plain in zip(grads[True], grads[False]):
        for g, ref in zip(step_ckpt, step_plain):
            torch.testing.assert_close(g, ref, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------ offload


def test_offload_on_a_cpu_plan_is_a_logged_no_op(model_dir, caplog):
    import logging

    data = ppo_batch()
    results = {}
    for offload in (False, True):
        plan = cpu_plan(model_dir, actor=role_plan(param_offload=offload, optimizer_offload=offload))
        with caplog.at_level(logging.INFO, logger="verl.workers.fsdp_workers"):
            worker = _actor(model_dir, plan, role="actor")
        assert not worker._actor_model.optimizer_offload
        batch = data.select(list(data.batch.keys()))
        batch.batch["old_log_probs"] = worker.compute_log_prob(batch).batch["old_log_probs"]
        metrics = worker.update_actor(batch).meta_info["metrics"]
        results[offload] = (batch.batch["old_log_probs"], metrics["actor/grad_norm"], metrics["actor/pg_loss"])
    assert "param_offload and optimizer_offload on a cpu device is a no-op" in caplog.text
    assert results[True][1:] == results[False][1:]
    torch.testing.assert_close(results[True][0], results[False][0], atol=0, rtol=0)


def test_offload_decisions_on_an_accelerator_plan():
    from verl.utils.fsdp_utils import offload_applies
    from verl.workers.fsdp_workers import _PlannedModel

    assert offload_applies(True, "cuda") and not offload_applies(True, "cpu") and not offload_applies(False, "cuda")
    on_gpu = _PlannedModel("actor", role_plan(optimizer_offload=True), "cuda", numerics_guard=False)
    on_cpu = _PlannedModel("actor", role_plan(optimizer_offload=True), "cpu", numerics_guard=False)
    assert on_gpu.optimizer_offload and not on_cpu.optimizer_offload


def test_param_offload_on_an_accelerator_plan_shards_with_a_cpu_offload_policy(model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    from verl.utils import fsdp_utils

    policies = []
    monkeypatch.setattr(fsdp_utils, "fully_shard", lambda module, **kw: policies.append(kw.get("offload_policy")))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    common = dict(param_dtype=torch.float32, compute_dtype=torch.float32, cast_params_for_compute=True,
                  param_offload=True)
    fsdp_utils.shard_model(model, device_type="cuda", **common)   # offloaded shards never move to the GPU
    assert len(policies) == 3 and all(isinstance(p, fsdp_utils.CPUOffloadPolicy) for p in policies)  # 2 layers + root
    policies.clear()
    fsdp_utils.shard_model(model, device_type="cpu", **common)
    assert policies == [None, None, None]


def test_every_fsdp_unit_reduces_gradients_as_sum_then_divide(model_dir, monkeypatch):
    """Under ReduceOp.AVG, gloo's reduce-scatter sums on torch <= 2.8 (two CPU ranks got twice the
    gradient); SUM-then-divide is right on every backend, so every unit must be switched to it."""
    from transformers import AutoModelForCausalLM

    from verl.utils import fsdp_utils

    calls = []
    real = fsdp_utils.FSDPModule.set_force_sum_reduction_for_comms

    def spy(self, enable):
        calls.append(enable)
        return real(self, enable)

    monkeypatch.setattr(fsdp_utils.FSDPModule, "set_force_sum_reduction_for_comms", spy)
    fsdp_utils.init_distributed("gloo")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    fsdp_utils.shard_model(model, param_dtype=torch.float32, compute_dtype=torch.float32,
                           cast_params_for_compute=True, param_offload=False, device_type="cpu")
    assert calls == [True] * len(fsdp_utils.fsdp_modules(model)) == [True] * 3   # 2 layers + root


def test_move_optimizer_state_moves_every_state_tensor():
    from verl.utils.fsdp_utils import move_optimizer_state

    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)
    layer(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    move_optimizer_state(optimizer, "meta")   # a device that is not the host, available on every machine
    states = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert len(states) == 6 and all(v.device.type == "meta" for v in states)  # step, exp_avg, exp_avg_sq x 2


def test_update_loads_the_optimizer_state_only_around_the_step(model_dir, monkeypatch):
    """An accelerator plan's optimizer offload, with the CPU as the stand-in accelerator."""
    from verl.utils import fsdp_utils

    worker = _actor(model_dir, cpu_plan(model_dir), role="actor")
    worker._actor_model.optimizer_offload = True   # what _PlannedModel decides for a cuda plan (tested above)
    events = []
    real_move = fsdp_utils.move_optimizer_state
    monkeypatch.setattr(fsdp_utils, "move_optimizer_state",
                        lambda opt, device: (events.append(("move", str(device))), real_move(opt, device)))
    real_step = worker.actor_optimizer.step
    monkeypatch.setattr(worker.actor_optimizer, "step", lambda *a, **k: (events.append(("step",)), real_step())[1])
    data = ppo_batch()
    data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
    worker.update_actor(data)
    # load to the worker's device, two optimizer steps (two mini-batches), back to host memory
    assert events == [("move", str(worker.device)), ("step",), ("step",), ("move", "cpu")]


# ------------------------------------------------------------------------------------ the sm_80+ plan


def test_bfloat16_plan_runs_a_whole_ppo_step_with_float32_outputs(model_dir):
    """The plan an A100/H100/H200 gets (float32 master weights, bfloat16 compute and rollout, ref and
    critic likewise), run on the CPU: every worker method of a PPO step works and hands back float32
    log-probs and values; losses stay finite. Autocast on CPU runs the same bf16 code path."""
    from worker_setup import critic_config

    from verl.workers.fsdp_workers import CriticWorker

    bf16 = role_plan(compute_dtype="bfloat16")
    plan = cpu_plan(model_dir, actor=bf16, critic=bf16)
    plan.ref = bf16
    plan.rollout = dataclasses.replace(plan.rollout, dtype="bfloat16")
    actor = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, use_kl_loss=True), role="actor_rollout_ref",
                                  plan=plan)
    actor.init_model()
    critic = CriticWorker(critic_config(model_dir), plan=plan)
    critic.init_model()

    generated = actor.generate_sequences(_prompts())
    assert generated.batch["responses"].shape[0] == 4
    data = ppo_batch()
    data.batch["old_log_probs"] = actor.compute_log_prob(data).batch["old_log_probs"]
    data.batch["ref_log_prob"] = actor.compute_ref_log_prob(data).batch["ref_log_prob"]
    data.batch["values"] = critic.compute_values(data).batch["values"]
    for key in ("old_log_probs", "ref_log_prob", "values"):
        assert data.batch[key].dtype == torch.float32, key
        assert torch.isfinite(data.batch[key]).all(), key
    actor_metrics = actor.update_actor(data).meta_info["metrics"]
    critic_metrics = critic.update_critic(data).meta_info["metrics"]
    for name in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert all(torch.isfinite(torch.tensor(v)) for v in actor_metrics[name]), name
    assert all(torch.isfinite(torch.tensor(v)) for v in critic_metrics["critic/vf_loss"])
    # the master weights stay float32 (bf16 is the compute dtype only)
    assert {p.dtype for p in actor.actor_module.parameters()} == {torch.float32}
