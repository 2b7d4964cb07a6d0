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
    plan = cpu_plan(model_dir, device="a100-80gb", actor_rollout_ref__rollout__dtype="float32")
    # the planner gathers weights in float32 so the rollout can stay float32; training autocasts to bfloat16
    assert plan.actor.compute_dtype == "bfloat16" and not plan.actor.cast_on_gather
    worker = _actor(model_dir, plan)
    assert worker._actor_model.precision.autocast_dtype == torch.bfloat16
    assert _generation_dtypes(worker) == {(None, torch.float32)}


def test_half_precision_rollout_over_a_float32_actor_autocasts(model_dir):
    worker = _actor(model_dir, _plan(model_dir, "bfloat16"))
    assert worker._actor_model.precision.autocast_dtype is None
    assert _generation_dtypes(worker) == {(torch.bfloat16, torch.float32)}


def test_rollout_follows_the_fp16_guard(model_dir, monkeypatch):
    import verl.compat.apply.numerics as numerics

    passed = _actor(model_dir, cpu_plan(model_dir, device="t4"))
    passed.compute_log_prob(ppo_batch())   # the guard runs here, so its own forwards are not recorded below
    assert _generation_dtypes(passed) == {(torch.float16, torch.float32)}

    monkeypatch.setattr(numerics, "check_half_precision", lambda model, batch, dtype: (False, "forced in a test"))
    failed = _actor(model_dir, cpu_plan(model_dir, device="t4"))
    failed.compute_log_prob(ppo_batch())
    assert _generation_dtypes(failed) == {(None, torch.float32)}
    assert failed.rollout.dtype == torch.float32


# ------------------------------------------------------------------------------------ critic model


def test_value_head_has_no_dropout_in_train_mode(model_dir):
    """transformers' token classifiers default to dropout 0.1 before the head; a critic must not have it."""
    from verl.workers.model_building.loading import build_model

    critic = build_model(model_dir, role_plan(), value_head=True, train=True)
    assert critic.training
    assert all(m.p == 0.0 for m in critic.modules() if isinstance(m, torch.nn.Dropout))
    ids = ppo_batch(batch_size=2).batch["input_ids"]
    torch.testing.assert_close(critic(input_ids=ids).logits, critic(input_ids=ids).logits, atol=0, rtol=0)


# ------------------------------------------------------------------------------------ numerics guard switch


def test_numerics_guard_false_skips_the_check_and_casts_on_gather(model_dir, monkeypatch):
    """`compat.numerics_guard: false` reaches the plan: no check, FSDP casts on gather, and the frozen
    reference is kept in float16 (nothing to compare it against)."""
    import verl.compat.apply.numerics as numerics
    from verl.utils import fsdp_utils

    def never(*_):
        raise AssertionError("the numerics guard ran although compat.numerics_guard=false")

    monkeypatch.setattr(numerics, "check_half_precision", never)
    plan = cpu_plan(model_dir, device="t4", compat__numerics_guard=False)
    assert not plan.actor.numerics_guard and plan.actor.cast_on_gather and plan.actor.grad_scaler
    assert (plan.ref.param_dtype, plan.ref.numerics_guard) == ("float16", False)
    policies = []
    real_shard = fsdp_utils.fully_shard
    monkeypatch.setattr(fsdp_utils, "fully_shard",
                        lambda module, **kw: (policies.append(kw.get("mp_policy")), real_shard(module, **kw))[1])
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role="actor_rollout", plan=plan)
    worker.init_model()
    assert not worker._actor_model.guard_pending
    assert {(p.param_dtype, p.reduce_dtype) for p in policies} == {(torch.float16, torch.float32)}
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


def test_offload_on_a_cpu_device_is_planned_off(model_dir):
    """Whether offload applies is the planner's decision: on a CPU device a user's offload is adapted
    off with a warning naming the key (host memory already), and the worker applies that plan."""
    plan = cpu_plan(model_dir, actor_rollout_ref__actor__fsdp_config__param_offload=True,
                    actor_rollout_ref__actor__fsdp_config__optimizer_offload=True)
    assert not plan.actor.param_offload and not plan.actor.optimizer_offload
    assert any("actor_rollout_ref.actor.fsdp_config.optimizer_offload=True" in w and "host memory already" in w
               for w in plan.warnings)
    assert not _actor(model_dir, plan, role="actor")._actor_model.optimizer_offload


def test_the_worker_applies_the_plans_offload_as_given():
    from verl.workers.fsdp_workers import _PlannedModel

    for device_type in ("cuda", "cpu"):
        for offload in (True, False):
            assert _PlannedModel("actor", role_plan(optimizer_offload=offload), device_type).optimizer_offload is offload


def test_param_offload_on_an_accelerator_plan_shards_with_a_cpu_offload_policy(model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    from verl.utils import fsdp_utils

    policies = []
    monkeypatch.setattr(fsdp_utils, "fully_shard", lambda module, **kw: policies.append(kw.get("offload_policy")))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    common = dict(param_dtype=torch.float32, compute_dtype=torch.float32, cast_params_for_compute=True,
                  reduce_dtype=torch.float32)
    fsdp_utils.shard_model(model, device_type="cuda", param_offload=True, **common)   # shards never move to the GPU
    assert len(policies) == 3 and all(isinstance(p, fsdp_utils.CPUOffloadPolicy) for p in policies)  # 2 layers + root
    policies.clear()
    fsdp_utils.shard_model(model, device_type="cpu", param_offload=False, **common)
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
                           cast_params_for_compute=True, reduce_dtype=torch.float32, param_offload=False,
                           device_type="cpu")
    assert calls == [True] * len(fsdp_utils.fsdp_modules(model)) == [True] * 3   # 2 layers + root


def test_move_optimizer_state_moves_every_per_element_state_tensor():
    """AdamW's moments move; its scalar `step` stays on the host, where torch keeps it (non-fused AdamW
    reads it there every step)."""
    from verl.utils.fsdp_utils import move_optimizer_state

    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)
    layer(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    move_optimizer_state(optimizer, "meta")   # a device that is not the host, available on every machine
    states = [(k, v) for s in optimizer.state.values() for k, v in s.items() if isinstance(v, torch.Tensor)]
    assert len(states) == 6  # step, exp_avg, exp_avg_sq x 2 parameters
    assert {v.device.type for k, v in states if k != "step"} == {"meta"}
    assert {v.device.type for k, v in states if k == "step"} == {"cpu"}


def test_update_loads_the_optimizer_state_only_for_each_step(model_dir, monkeypatch):
    """An accelerator plan's optimizer offload, with the CPU as the stand-in accelerator: the state comes to
    the worker's device for each optimizer step and leaves right after it, so no forward or backward of the
    update shares the device with it (the memory model counts it in the step only)."""
    from verl.utils import fsdp_utils

    events = []
    real_move = fsdp_utils.move_optimizer_state
    monkeypatch.setattr(fsdp_utils, "move_optimizer_state",
                        lambda opt, device, **kw: (events.append(("move", str(device))), real_move(opt, device, **kw)))
    store = fsdp_utils._PinnedHostState.store     # back to the host, into the reused host buffers
    monkeypatch.setattr(fsdp_utils._PinnedHostState, "store",
                        lambda self, opt: (events.append(("move", "cpu")), store(self, opt)))
    worker = _actor(model_dir, cpu_plan(model_dir, actor=role_plan(optimizer_offload=True)), role="actor")
    worker.actor_module.register_forward_pre_hook(lambda *_: events.append(("forward",)))
    worker.actor_optimizer.register_step_pre_hook(lambda *_: events.append(("step",)))
    data = ppo_batch()
    data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
    for _ in range(2):      # the first update creates the state, the second finds it
        events.clear()
        worker.update_actor(data)
        runs = [e for i, e in enumerate(events) if e != ("forward",) or events[i - 1] != ("forward",)]
        # two mini-batches: the forwards (and backwards) of each, then its step with the state on the device
        mini_batch = [("forward",), ("move", str(worker.device)), ("step",), ("move", "cpu")]
        assert runs == mini_batch * 2


# ------------------------------------------------------------------------------------ precision is applied, not decided


@pytest.mark.parametrize("param,compute,cast,reduce,scaler,guard", [
    ("float32", "float32", False, "float32", False, False),
    ("float32", "bfloat16", True, "float32", False, False),
    ("float32", "bfloat16", False, "bfloat16", False, False),
    ("float32", "float16", False, "float32", True, True),
    ("float32", "float16", True, "float16", True, False),
    ("float16", "float16", False, "float32", False, False),
    ("bfloat16", "bfloat16", False, "float32", False, False),
])
def test_the_worker_applies_each_precision_exactly_as_planned(monkeypatch, param, compute, cast, reduce, scaler,
                                                               guard):
    """Whatever the role plan says reaches FSDP and autocast unchanged: the worker decides nothing."""
    from verl.compat import torch_dtype
    from verl.utils import fsdp_utils
    from verl.workers.fsdp_workers import _PlannedModel

    seen = {}
    monkeypatch.setattr(fsdp_utils, "shard_model", lambda module, **kw: seen.update(kw) or module)
    plan = role_plan(param_dtype=param, compute_dtype=compute, cast_on_gather=cast, reduce_dtype=reduce,
                     grad_scaler=scaler, numerics_guard=guard, guard_fallback_dtype="float32" if guard else None,
                     reshard_after_forward=param == compute)   # both values across the cases
    planned = _PlannedModel("actor", plan, "cpu")
    planned.shard(torch.nn.Linear(2, 2))
    assert seen == {"param_dtype": torch_dtype(param), "compute_dtype": torch_dtype(compute),
                    "cast_params_for_compute": cast, "reduce_dtype": torch_dtype(reduce), "param_offload": False,
                    "device_type": "cpu", "reshard_after_forward": param == compute}
    assert planned.precision.autocast_dtype == (None if compute == "float32" else torch_dtype(compute))
    assert (planned.precision.scaler is not None) == scaler
    assert planned.guard_pending == guard
