"""The plan's reshard_after_forward reaches FSDP2 in the actor worker, and changes no number.

Real planner, real worker, float32 on CPU (FSDP2 on gloo at world size 1, asked for with
`compat.always_fsdp=true`, where the CPU plan keeps gathered weights; its default there is no
wrapper at all, tested last). A decoder layer unit's registered parameters are its DTensor shards when resharded
and plain tensors while gathered, which is what is checked at the end of each update forward.
Tolerance: the same float32 math either way (only when weights are gathered differs): 1e-6.
"""
import dataclasses
import os
import sys

import pytest
import torch
from torch.distributed.tensor import DTensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import PROMPT_LEN, actor_rollout_ref_config, cpu_plan, ppo_batch, tiny_model  # noqa: E402

from verl.compat.planning.model_spec import ModelSpec  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402

torch.set_num_threads(1)
WRAPPED = {"compat__always_fsdp": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2")))


def _gathered(module) -> list[bool]:
    return [not isinstance(next(layer.parameters()), DTensor) for layer in module.model.layers]


def _gathered_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters() if not isinstance(p, DTensor))


def _run(model_dir, plan) -> tuple[list, list]:
    """Old log-probs, generate and one update; the layers' state after each update forward, and the
    weights after the update."""
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role="actor_rollout", plan=plan)
    worker.init_model()
    module = worker.actor_module
    data = ppo_batch()
    prompts = {k: data.batch[k][:, :PROMPT_LEN] for k in ("input_ids", "attention_mask", "position_ids")}
    data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
    assert _gathered_bytes(module) == 0                    # a forward without gradients reshards as it goes
    worker.generate_sequences(DataProto.from_dict(prompts))
    assert _gathered_bytes(module) == 0                    # full_params gave everything back (and the plan's
    states = []                                            # setting, which the update below shows)

    def end_of_forward(m, *_):
        if torch.is_grad_enabled():
            states.append((_gathered(m), _gathered_bytes(m)))

    hook = module.register_forward_hook(end_of_forward)
    worker.update_actor(data)
    hook.remove()
    assert _gathered_bytes(module) == 0                    # every unit resharded after its backward
    return states, [p.detach().full_tensor().clone() for p in module.parameters()]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_plans_reshard_after_forward_reaches_fsdp_and_the_update_is_unchanged(model_dir, checkpointing):
    """With gradient checkpointing too: the recomputed forward finds its layer still gathered."""
    ckpt = {"actor_rollout_ref__model__enable_gradient_checkpointing": checkpointing, **WRAPPED}
    kept_plan = cpu_plan(model_dir, **ckpt)
    resharded_plan = cpu_plan(model_dir, actor_rollout_ref__actor__fsdp_config__reshard_after_forward=True, **ckpt)
    assert kept_plan.actor.gradient_checkpointing is resharded_plan.actor.gradient_checkpointing is checkpointing
    assert kept_plan.actor.reshard_after_forward is False
    assert kept_plan.reasons["actor.reshard_after_forward"].startswith("one device")
    assert resharded_plan.actor.reshard_after_forward is True

    kept_states, kept_weights = _run(model_dir, kept_plan)
    resharded_states, resharded_weights = _run(model_dir, resharded_plan)

    assert kept_states and all(all(layers) for layers, _ in kept_states)        # every layer kept for backward
    assert resharded_states and not any(any(layers) for layers, _ in resharded_states)   # every layer resharded
    # what the memory model counts for the kept copy: the whole model in the gather dtype (float32 here)
    assert kept_plan.actor.cast_on_gather is False and kept_plan.actor.param_dtype == "float32"
    assert {size for _, size in kept_states} == {ModelSpec.from_pretrained(model_dir).num_params * 4}
    for kept, resharded in zip(kept_weights, resharded_weights, strict=True):
        torch.testing.assert_close(kept, resharded, atol=1e-6, rtol=0)


def _log_probs_and_layer_states(model_dir, plan):
    """Old log-probs from the actor worker, and which layers were gathered at each forward's start."""
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role="actor_rollout", plan=plan)
    worker.init_model()
    module = worker.actor_module
    states = []
    hook = module.register_forward_pre_hook(lambda m, *_: states.append(_gathered(m)))
    out = worker.compute_log_prob(ppo_batch()).batch["old_log_probs"]
    hook.remove()
    assert _gathered_bytes(module) == 0                    # given back after the call either way
    return out, states


def test_the_plans_gather_for_forward_holds_the_whole_model_for_a_log_prob_call(model_dir):
    """The real CPU plan gathers once per forward-only call: every micro-batch's forward starts with
    every layer gathered; per-layer gathering (the plan with it off) starts each with none. Same numbers."""
    plan = cpu_plan(model_dir, **WRAPPED)
    assert plan.actor.gather_for_forward is True
    assert plan.reasons["actor.gather_for_forward"].startswith("one gather per call")
    per_layer_plan = dataclasses.replace(plan, actor=dataclasses.replace(plan.actor, gather_for_forward=False))
    whole, whole_states = _log_probs_and_layer_states(model_dir, plan)
    per_layer, per_layer_states = _log_probs_and_layer_states(model_dir, per_layer_plan)
    assert whole_states and all(all(layers) for layers in whole_states)
    assert per_layer_states and not any(any(layers) for layers in per_layer_states)
    torch.testing.assert_close(whole, per_layer, atol=1e-6, rtol=0)


def test_one_device_default_runs_unwrapped_with_the_same_numbers(model_dir):
    """The real CPU plan at one device runs the actor unwrapped (FSDP2 would only copy its float32
    weights there); old log-probs, a greedy validation rollout and the weights after one update equal
    those of the same plan wrapped (`compat.always_fsdp=true`)."""
    from verl.utils import fsdp_utils

    results = {}
    for name, plan in (("unwrapped", cpu_plan(model_dir)), ("wrapped", cpu_plan(model_dir, **WRAPPED))):
        worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role="actor_rollout", plan=plan)
        worker.init_model()
        module = worker.actor_module
        assert bool(fsdp_utils.fsdp_modules(module)) is plan.actor.fsdp is (name == "wrapped")
        # rows into .grad only unwrapped: under FSDP2 the embedding keeps torch's own backward
        assert ("forward" in vars(module.get_input_embeddings())) is (name == "unwrapped")
        if name == "unwrapped":
            initial = [p.detach().clone() for p in module.parameters()]
        data = ppo_batch()
        data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
        prompts = DataProto.from_dict({k: data.batch[k][:, :PROMPT_LEN]
                                       for k in ("input_ids", "attention_mask", "position_ids")},
                                      meta_info={"validate": True})
        responses = worker.generate_sequences(prompts).batch["responses"]
        worker.update_actor(data)
        weights = [p.detach().full_tensor() if isinstance(p, DTensor) else p.detach().clone()
                   for p in module.parameters()]
        results[name] = data.batch["old_log_probs"], responses, weights
    (lp_u, resp_u, w_u), (lp_w, resp_w, w_w) = results["unwrapped"], results["wrapped"]
    torch.testing.assert_close(lp_u, lp_w, atol=1e-6, rtol=0)
    assert torch.equal(resp_u, resp_w)
    assert len(w_u) == len(w_w) and all(a.shape == b.shape for a, b in zip(w_u, w_w))
    for a, b in zip(w_u, w_w):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert not all(torch.equal(a, b) for a, b in zip(w_u, initial))     # the update changed the weights


def test_a_one_device_plan_refuses_to_run_unwrapped_on_several_ranks(model_dir, monkeypatch):
    """Unwrapped replicas would each train on their own share of the batch and drift apart silently."""
    from verl.workers import fsdp_workers

    plan = cpu_plan(model_dir)
    assert plan.actor.fsdp is False
    monkeypatch.setattr(fsdp_workers, "_ranks", lambda: 2)
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role="actor", plan=plan)
    with pytest.raises(RuntimeError, match="trainer.n_gpus_per_node x trainer.nnodes = 2"):
        worker.init_model()
