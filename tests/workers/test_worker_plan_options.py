"""Plan options the workers must honour on CPU: rollout dtype, gradient checkpointing, offload.

Tolerances: gradient checkpointing recomputes the same float32 forward, so gradients agree to 1e-6.
"""
import dataclasses
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import PROMPT_LEN, actor_rollout_ref_config, cpu_plan, ppo_batch, role_plan, tiny_model  # noqa: E402

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
    """(autocast dtype or None, weight dtype) at every forward of one generate_sequences call."""
    seen = []

    def record(module, *_):
        autocast = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        seen.append((autocast, next(module.parameters()).dtype))

    hook = worker.actor_module.register_forward_pre_hook(record)
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
