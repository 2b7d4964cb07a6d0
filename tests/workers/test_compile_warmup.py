"""compat.compile_warmup=background in the actor worker: the first step's passes (rollout, log-probs,
reference log-probs, update) run eagerly while the compiled decoder layers, log-prob kernels and decode
step are built beside them; from the next step on every pass runs compiled code, and the worker's
results stay the eager worker's: greedy responses equal, log-probs and losses to float32 rounding (1e-5).

CPU, float32, torch.compile's "eager" backend (dynamo's graphs run by torch's kernels; code generation on
CPU takes minutes). The triton backend on a GPU is measured by benchmarks/speed.py.
"""
import dataclasses
import os
import sys
import threading

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import PROMPT_LEN, RESPONSE_LEN, actor_rollout_ref_config, cpu_plan, ppo_batch, tiny_model  # noqa: E402

from torch.utils._pytree import tree_flatten  # noqa: E402

from verl.compat.planning.memory import GiB, Workload, estimate_memory  # noqa: E402
from verl.compat.planning.model_spec import ModelSpec  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402
from verl.workers.model_building import layer_compile  # noqa: E402

PASSES = ("gen", "old_log_prob", "ref", "update_actor")


@pytest.fixture
def dynamo_cache():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _worker(model_dir, plan, role="actor_rollout_ref"):
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, use_kl_loss=role == "actor_rollout_ref"),
                                   role=role, plan=plan)
    worker.init_model()
    return worker


def _prompts(sample: bool = False) -> DataProto:
    data = ppo_batch(batch_size=4)
    prompts = DataProto.from_dict({k: data.batch[k][:, :PROMPT_LEN] for k in ("input_ids", "attention_mask",
                                                                             "position_ids")})
    prompts.meta_info["do_sample"] = sample
    return prompts


def _step(worker, sample: bool = False) -> dict:
    """One step's passes: greedy (or sampled) responses, log-probs, reference log-probs, update metrics, and
    whether each pass ran compiled code."""
    gen = worker.generate_sequences(_prompts(sample))
    data = ppo_batch()
    old = worker.compute_log_prob(data)
    data.batch["old_log_probs"] = old.batch["old_log_probs"]
    metrics = {**gen.meta_info["metrics"], **old.meta_info["metrics"]}
    if worker.ref_policy is not None:
        ref = worker.compute_ref_log_prob(data)
        data.batch["ref_log_prob"] = ref.batch["ref_log_prob"]
        metrics.update(ref.meta_info["metrics"])
    update = worker.update_actor(data).meta_info["metrics"]
    metrics.update(update)
    return {"responses": gen.batch["responses"], "old": old.batch["old_log_probs"], "ref": data.batch.get("ref_log_prob"),
            "update": update, "compiled": [metrics.get(f"perf/compiled_layers/{p}") for p in PASSES],
            "compile_s": [metrics.get(f"perf/compile_s/{p}") for p in PASSES]}


def test_background_warmup_goes_from_eager_to_compiled_with_equal_results(tmp_path, monkeypatch, dynamo_cache):
    monkeypatch.setattr(layer_compile, "BACKEND", "eager")
    model_dir = tiny_model(str(tmp_path / "tiny"))
    plain = cpu_plan(model_dir)
    background = dataclasses.replace(plain, torch_compile=True, compile_warmup="background",
                                     rollout=dataclasses.replace(plain.rollout, compile_backend="eager"))
    eager, beside = _worker(model_dir, plain), _worker(model_dir, background)
    assert eager._compiler is None and beside._compiler.mode == "background"
    seen, compile_s = [], []
    for _ in range(3):
        a, b = _step(eager), _step(beside)
        assert torch.equal(b["responses"], a["responses"])
        mask = ppo_batch().batch["response_mask"].bool()
        torch.testing.assert_close(b["old"][mask], a["old"][mask], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b["ref"][mask], a["ref"][mask], atol=1e-5, rtol=1e-5)
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
            assert b["update"][key] == pytest.approx(a["update"][key], rel=1e-5, abs=1e-7), key
        assert a["compiled"] == a["compile_s"] == [None] * 4   # nothing compiled: no pass reports
        seen.append(b["compiled"])
        compile_s.append(b["compile_s"])
        assert beside._compiler.wait_built(60)   # the test waits; a run goes on eagerly until the build is done
    assert seen == [[0.0] * 4, [1.0] * 4, [1.0] * 4]
    # every pass reports the seconds torch.compile ran during it; once the compiled code runs, nothing compiles
    assert all(s is not None and s >= 0 for step in compile_s for s in step)
    assert compile_s[2] == [0.0] * 4
    # nothing compiles while the first step runs: the side thread starts once its passes have all run
    assert compile_s[0] == [0.0] * 4
    # built from the first step's calls: the decode step (no grad), the layers and log-prob kernels
    assert beside.rollout._step.kinds and beside.actor._kernels.lse.kinds
    assert beside._compiler.takeover_s is not None and beside._compiler.failed is None
    for pa, pb in zip(eager.actor_module.parameters(), beside.actor_module.parameters()):
        torch.testing.assert_close(pb, pa, atol=1e-6, rtol=1e-5)



def test_the_plan_counts_the_input_copies_the_side_thread_waits_on(tmp_path, monkeypatch, dynamo_cache):
    """From the first step's calls until the build starts, the side thread's copies of one call's inputs per kind
    of call (the decode step's cache and layer, the sampler's logits, each pass's layer and hidden states, the
    log-prob kernels' chunks) stay on the device. The memory model's eager check for `background` counts them
    (`memory.beside_copies`): within 5% of what the real worker holds after a sampled first step."""
    monkeypatch.setattr(layer_compile, "BACKEND", "eager")
    model_dir = tiny_model(str(tmp_path / "tiny"))
    plain = cpu_plan(model_dir)
    background = dataclasses.replace(plain, torch_compile=True, compile_warmup="background",
                                     rollout=dataclasses.replace(plain.rollout, compile_backend="eager"))
    worker = _worker(model_dir, background)
    _step(worker, sample=True)
    queued = [example for _, example in list(worker._compiler._queue.queue)]
    leaves = [leaf for e in queued for leaf in tree_flatten((e.args, e.kwargs))[0]]
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    tensors += [t for m in leaves if isinstance(m, torch.nn.Module) for t in (*m.parameters(), *m.buffers())]
    held = sum(t.numel() * t.element_size() for t in tensors)
    rows = _prompts().batch["input_ids"].shape[0]
    estimate = estimate_memory(ModelSpec.from_pretrained(model_dir), Workload(PROMPT_LEN, RESPONSE_LEN, rows),
                               background.actor, background.rollout, None, background.ref, device_memory_gb=20,
                               backend="cpu", beside=True)
    predicted = {phase.terms["compile.beside copies"] * GiB for phase in estimate.phases.values()}
    assert len(predicted) == 1 and held > 0
    assert predicted.pop() == pytest.approx(held, rel=0.05)


class ThreadsOfCompiles:
    """torch.compile's "eager" backend, noting the thread of every compile."""

    def __init__(self):
        self.threads = []

    def __call__(self, gm, example_inputs):
        self.threads.append(threading.get_ident())
        return gm.forward


def test_sharded_layers_run_what_the_side_thread_built(tmp_path, monkeypatch, dynamo_cache):
    """The a100 plan on the CPU: FSDP2 keeps float32 shards between passes and gathers them cast to bf16 for
    each layer's forward. The side thread builds on twins of the gathered layers (verl/utils/compile_beside.py),
    and that code serves the live sharded layers: after the switch nothing compiles on the worker's thread,
    and the results are the eager worker's. (No reference model here: the a100 plan keeps it unwrapped with
    frozen bf16 weights, whose per-module upcast forwards dynamo guards by identity, a recompile per layer
    in any compile mode.)"""
    backend = ThreadsOfCompiles()
    monkeypatch.setattr(layer_compile, "BACKEND", backend)
    model_dir = tiny_model(str(tmp_path / "tiny"))
    plain = cpu_plan(model_dir, device="a100-80gb")
    assert plain.actor.fsdp and plain.actor.cast_on_gather and plain.actor.compute_dtype != "float32"
    eager = _worker(model_dir, plain, role="actor_rollout")
    beside = _worker(model_dir, dataclasses.replace(plain, torch_compile=True, compile_warmup="background"),
                     role="actor_rollout")
    seen = []
    for _ in range(3):
        a, b = _step(eager), _step(beside)
        mask = ppo_batch().batch["response_mask"].bool()
        torch.testing.assert_close(b["old"][mask], a["old"][mask], atol=1e-5, rtol=1e-5)
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert b["update"][key] == pytest.approx(a["update"][key], rel=1e-5, abs=1e-7), key
        seen.append([b["compiled"][1], b["compiled"][3]])   # log-probs, update (no compiled decode step here)
        assert beside._compiler.wait_built(60)
    assert seen == [[0.0] * 2, [1.0] * 2, [1.0] * 2]
    assert backend.threads and threading.get_ident() not in backend.threads
