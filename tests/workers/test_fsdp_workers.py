"""The FSDP workers on CPU with a tiny Qwen2, in-process (world size 1) and as two gloo processes.

Tolerances: float32 vs a float64 reference forward, 1e-5 absolute on log-probs (a 2-layer, width-32
model accumulates ~1e-6 of float32 rounding); re-splitting the same batch into other micro-batches
or ranks changes only the summation order, so gradients, losses and grad norms agree to 1e-5 relative.
"""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import (  # noqa: E402
    whole,
    PROMPT_LEN,
    RESPONSE_LEN,
    actor_rollout_ref_config,
    cpu_plan,
    GradRecorder,
    critic_config,
    ppo_batch,
    run_ranks,
    tiny_model,
)

from verl.protocol import DataProto  # noqa: E402
from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2")))


def _actor(model_dir, role="actor_rollout", plan=None, **actor_overrides):
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, **actor_overrides), role=role,
                                   plan=plan or cpu_plan(model_dir))
    worker.init_model()
    return worker


def _float64_log_probs(model_dir, data: DataProto) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="sdpa")
    with torch.no_grad():
        logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                       position_ids=data.batch["position_ids"]).logits
    logp = torch.log_softmax(logits[:, PROMPT_LEN - 1 : -1], dim=-1)
    return logp.gather(-1, data.batch["responses"].unsqueeze(-1)).squeeze(-1)


def _with_old_log_probs(worker, data: DataProto) -> DataProto:
    data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
    return data


# ------------------------------------------------------------------------------------ actor


def test_compute_log_prob_matches_float64_reference(model_dir):
    worker = _actor(model_dir)
    data = ppo_batch()
    out = worker.compute_log_prob(data)
    mask = data.batch["response_mask"].bool()
    reference = _float64_log_probs(model_dir, data)
    assert out.batch["old_log_probs"].dtype == torch.float32
    assert out.batch["old_log_probs"].shape == (8, RESPONSE_LEN)
    torch.testing.assert_close(out.batch["old_log_probs"][mask].double(), reference[mask], atol=1e-5, rtol=0)
    assert (out.batch["entropys"][mask] > 0).all()
    assert out.meta_info["temperature"] == 1.0


def test_dynamic_bsz_log_probs_equal_fixed_micro_batches(model_dir):
    fixed = _actor(model_dir).compute_log_prob(ppo_batch()).batch["old_log_probs"]
    config = actor_rollout_ref_config(model_dir)
    config.rollout.log_prob_use_dynamic_bsz = True
    config.rollout.log_prob_max_token_len_per_gpu = 20
    worker = ActorRolloutRefWorker(config, role="actor_rollout", plan=cpu_plan(model_dir))
    worker.init_model()
    dynamic = worker.compute_log_prob(ppo_batch()).batch["old_log_probs"]
    torch.testing.assert_close(dynamic, fixed, atol=1e-6, rtol=1e-5)


def test_update_actor_changes_weights_and_reports_upstream_metrics(model_dir):
    worker = _actor(model_dir, role="actor_rollout_ref", use_kl_loss=True, entropy_coeff=0.01, ppo_mini_batch_size=2)
    data = _with_old_log_probs(worker, ppo_batch())
    data = data.union(worker.compute_ref_log_prob(data))
    torch.testing.assert_close(data.batch["ref_log_prob"], data.batch["old_log_probs"])
    before = [whole(p.detach()).clone() for p in worker.actor_module.parameters()]

    metrics = worker.update_actor(data).meta_info["metrics"]

    after = [whole(p.detach()) for p in worker.actor_module.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    for name in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac", "actor/pg_clipfrac_lower",
                 "actor/kl_loss", "actor/kl_coef", "actor/grad_norm", "actor/lr", "perf/max_memory_allocated_gb",
                 "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb", "perf/predicted_peak_gb"):
        assert name in metrics, name
    # 8 sequences, mini-batch of 2 prompts x n=2 -> two optimizer steps
    assert len(metrics["actor/grad_norm"]) == 2
    assert metrics["actor/lr"] == pytest.approx(1e-3)
    # the reference policy is a separate frozen copy: the update moved the actor, not the ref
    assert torch.equal(worker.compute_ref_log_prob(data).batch["ref_log_prob"], data.batch["ref_log_prob"])
    assert not torch.allclose(worker.compute_log_prob(data).batch["old_log_probs"], data.batch["old_log_probs"])




@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batching_never_changes_the_gradient(model_dir, loss_agg_mode):
    worker = _actor(model_dir, role="actor", ppo_mini_batch_size=4, loss_agg_mode=loss_agg_mode, entropy_coeff=0.01,
                    grad_clip=1e6)
    data = _with_old_log_probs(worker, ppo_batch())
    actor = worker.actor
    recorder = GradRecorder(worker.actor_module.parameters())
    actor.actor_optimizer = recorder
    results = {}
    for label, settings in {"whole": dict(ppo_micro_batch_size_per_gpu=8, use_dynamic_bsz=False),
                            "micro1": dict(ppo_micro_batch_size_per_gpu=1, use_dynamic_bsz=False),
                            "dynamic": dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20)}.items():
        for key, value in settings.items():
            actor.config[key] = value
        metrics = actor.update_policy(data)
        results[label] = (recorder.grads.pop(), metrics)
    whole_grads, whole_metrics = results["whole"]
    for label in ("micro1", "dynamic"):
        grads, metrics = results[label]
        for g, ref in zip(grads, whole_grads):
            torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-7)
        assert metrics["actor/pg_loss"] == pytest.approx(whole_metrics["actor/pg_loss"], rel=1e-5)
        assert metrics["actor/grad_norm"] == pytest.approx(whole_metrics["actor/grad_norm"], rel=1e-5)


def test_generate_sequences_uses_actor_weights_and_restores_train_mode(model_dir):
    worker = _actor(model_dir)
    data = ppo_batch(batch_size=4)
    prompts = DataProto.from_dict({k: data.batch[k][:, :PROMPT_LEN] for k in ("input_ids", "attention_mask",
                                                                              "position_ids")})
    out = worker.generate_sequences(prompts)
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert key in out.batch.keys(), key
    assert out.batch["responses"].shape == (4, RESPONSE_LEN)
    assert out.batch["input_ids"].shape == (4, PROMPT_LEN + RESPONSE_LEN)
    assert worker.actor_module.training
    assert "perf/max_memory_allocated_gb" in out.meta_info["metrics"]


def test_mini_batch_must_split_over_ranks_and_micro_batches(model_dir):
    with pytest.raises(ValueError, match="ppo_micro_batch_size_per_gpu"):
        ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=4),
                              role="actor", plan=cpu_plan(model_dir))


def test_a_plan_naming_an_engine_the_workers_lack_is_refused(model_dir):
    import dataclasses

    plan = cpu_plan(model_dir)
    plan.rollout = dataclasses.replace(plan.rollout, name="sglang")
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role="actor_rollout", plan=plan)
    with pytest.raises(ValueError, match=r"'sglang' is not one of this verl's engines \['hf', 'vllm'\]"):
        worker.init_model()


# ------------------------------------------------------------------------------------ fp16


def _fp16_plan(model_dir):
    return cpu_plan(model_dir, device="t4")   # the planner's float16 plan (scaler, numerics guard), run on the CPU


def test_fp16_plan_uses_autocast_and_grad_scaler(model_dir):
    worker = _actor(model_dir, role="actor", plan=_fp16_plan(model_dir))
    precision = worker._actor_model.precision
    assert precision.autocast_dtype == torch.float16
    assert isinstance(precision.scaler, torch.amp.GradScaler)
    data = _with_old_log_probs(worker, ppo_batch())   # the guard ran here, on the first real batch
    assert not worker._actor_model.guard_pending
    metrics = worker.update_actor(data).meta_info["metrics"]
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics["actor/pg_loss"])
    assert precision.scaler.get_scale() > 0


def test_failed_numerics_guard_switches_the_role_to_float32(model_dir, monkeypatch):
    import verl.compat.apply.numerics as numerics

    monkeypatch.setattr(numerics, "check_half_precision", lambda model, batch, dtype: (False, "forced in a test"))
    worker = _actor(model_dir, role="actor", plan=_fp16_plan(model_dir))
    out = worker.compute_log_prob(ppo_batch())
    assert worker._actor_model.precision.autocast_dtype is None
    assert worker._actor_model.precision.scaler is None
    assert "forced in a test" in out.meta_info["compat_notes"][0]
    fp32 = _actor(model_dir, role="actor").compute_log_prob(ppo_batch()).batch["old_log_probs"]
    torch.testing.assert_close(out.batch["old_log_probs"], fp32)


def test_a_failed_guard_reissues_the_plan_for_actor_ref_and_rollout(model_dir, monkeypatch):
    """The actor's guard fails: the worker re-issues the plan (verl.compat.apply.precision) and applies it to
    the actor, the frozen reference (same weights, so it overflows too) and the rollout; the update
    travels in meta_info for the trainer, which logs it once."""
    import verl.compat.apply.numerics as numerics
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    monkeypatch.setattr(numerics, "check_half_precision", lambda model, batch, dtype: (False, "forced in a test"))
    plan = _fp16_plan(model_dir)
    assert plan.ref.param_dtype == "float32" and plan.ref.numerics_guard   # a frozen fp16 role keeps fp32 weights
    worker = _actor(model_dir, role="actor_rollout_ref", plan=plan)
    out = worker.compute_log_prob(ppo_batch())
    assert (worker.plan.actor.compute_dtype, worker.plan.ref.compute_dtype, worker.plan.rollout.dtype) == \
        ("float32",) * 3
    assert not worker.plan.actor.grad_scaler and not worker.plan.ref.numerics_guard
    assert worker._ref_model.precision.autocast_dtype is None and not worker._ref_model.guard_pending
    assert worker.rollout.dtype == torch.float32
    assert plan.actor.compute_dtype == "float16"        # the plan given is not mutated: a new one is issued
    update = out.meta_info["compat_plan_updates"]
    assert [(u["role"], u["reason"]) for u in update] == [("actor", "forced in a test")]
    assert update[0]["line"].startswith("plan updated: actor.compute_dtype float16 -> float32")

    trainer = RayPPOTrainer.__new__(RayPPOTrainer)   # only the plan bookkeeping of the trainer
    trainer.plan, trainer._plan_lines = plan, set()
    trainer._pop_metrics(out)
    assert trainer.plan == worker.plan
    assert "compat_plan_updates" not in out.meta_info and "compat_notes" not in out.meta_info


# ------------------------------------------------------------------------------------ critic


def test_critic_values_sit_at_response_positions(model_dir):
    worker = CriticWorker(critic_config(model_dir), plan=cpu_plan(model_dir))
    worker.init_model()
    data = ppo_batch()
    values = worker.compute_values(data).batch["values"]
    assert values.shape == (8, RESPONSE_LEN)
    mask = data.batch["response_mask"].bool()
    assert (values[~mask] == 0).all()
    with torch.no_grad():
        logits = worker.critic_module(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                                      position_ids=data.batch["position_ids"]).logits.squeeze(-1)
    torch.testing.assert_close(values[mask], logits[:, PROMPT_LEN - 1 : -1][mask], atol=1e-6, rtol=1e-5)


def test_update_critic_lowers_the_value_loss(model_dir):
    worker = CriticWorker(critic_config(model_dir, ppo_mini_batch_size=4, cliprange_value=100.0), plan=cpu_plan(model_dir))
    worker.init_model()
    data = ppo_batch()
    data.batch["values"] = worker.compute_values(data).batch["values"]
    losses = []
    for _ in range(6):
        metrics = worker.update_critic(data).meta_info["metrics"]
        losses.append(metrics["critic/vf_loss"][0])
    assert losses[-1] < 0.5 * losses[0]
    for name in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"):
        assert name in metrics


# ------------------------------------------------------------------------------------ world size 2


def _run_ranks(model_dir, tmp_path, world: int, *extra: str) -> list[dict]:
    outs = [tmp_path / f"w{world}_r{rank}{''.join(extra)}.json" for rank in range(world)]
    run_ranks(lambda rank: [os.path.join(HERE, "dist_runner.py"), model_dir, str(outs[rank]), *extra], world)
    return [json.loads(o.read_text()) for o in outs]


def test_world_size_two_matches_world_size_one(model_dir, tmp_path):
    """Same seed, same 8 sequences: 2 gloo ranks x 4 rows give ws=1's losses and grad norms (rel 1e-5)."""
    from dist_runner import run

    single = run(model_dir)   # world size 1, in this process
    pair = _run_ranks(model_dir, tmp_path, 2)
    torch.testing.assert_close(torch.tensor(pair[0]["log_probs"] + pair[1]["log_probs"]),
                               torch.tensor(single["log_probs"]), atol=1e-6, rtol=1e-5)
    for name in ("actor/pg_loss", "actor/entropy"):
        # each rank reports its share of the global mean (x dp size); the mean over ranks is the global value
        mean_over_ranks = [(a + b) / 2 for a, b in zip(pair[0]["metrics"][name], pair[1]["metrics"][name])]
        assert mean_over_ranks == pytest.approx(single["metrics"][name], rel=1e-5, abs=1e-7), name
    for rank in pair:
        assert rank["metrics"]["actor/grad_norm"] == pytest.approx(single["metrics"]["actor/grad_norm"], rel=1e-5)
    assert len(single["metrics"]["actor/grad_norm"]) == 2   # ppo_epochs=2 over one mini-batch


def test_ranks_switch_to_the_compiled_layers_at_the_same_pass(model_dir, tmp_path):
    """compile_warmup=background on 2 gloo ranks, each with its own side thread: the ranks agree at every pass
    boundary (the minimum of their build states), so every pass runs eager code on both or compiled code on
    both, and the results stay world size 1's eager ones (log-probs 1e-6/1e-5, grad norms rel 1e-5)."""
    from dist_runner import run_background

    pair = _run_ranks(model_dir, tmp_path, 2, "background")
    flags = [rank["compiled"] for rank in pair]
    assert flags[0] == flags[1]
    assert flags[0][0] == [0.0, 0.0] and flags[0][-2:] == [[1.0, 1.0]] * 2   # eager first, compiled at the end
    single = run_background(model_dir, steps=len(flags[0]))
    for step, (a, b, ref) in enumerate(zip(pair[0]["log_probs"], pair[1]["log_probs"], single["log_probs"])):
        torch.testing.assert_close(torch.tensor(a + b), torch.tensor(ref), atol=1e-6, rtol=1e-5, msg=f"step {step}")
    for rank in pair:
        assert sum(rank["grad_norm"], []) == pytest.approx(sum(single["grad_norm"], []), rel=1e-5)


def test_token_budgets_agree_on_micro_batch_counts_across_ranks(model_dir, tmp_path):
    """Rank 0's short rows fit 2 to a micro-batch, rank 1's need 1 each: without agreeing on the count the
    ranks' FSDP collectives would not match (hang). With it, 2 ranks give ws=1's numbers (rel 1e-5)."""
    from dist_runner import run

    single = run(model_dir, dynamic=True)
    pair = _run_ranks(model_dir, tmp_path, 2, "dynamic")
    torch.testing.assert_close(torch.tensor(pair[0]["log_probs"] + pair[1]["log_probs"]),
                               torch.tensor(single["log_probs"]), atol=1e-6, rtol=1e-5)
    for rank in pair:
        assert rank["metrics"]["actor/grad_norm"] == pytest.approx(single["metrics"]["actor/grad_norm"], rel=1e-5)


@pytest.fixture
def dynamo_cache():
    """Compiled code per test: dynamo keeps at most 8 graphs per function across the whole process."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled_layers(module) -> int:
    """Decoder layers whose forward the plan's torch_compile replaced (verl.workers.model_building.layer_compile)."""
    return sum("forward" in vars(m) for m in module.modules() if type(m).__name__.endswith("DecoderLayer"))


def test_planned_torch_compile_compiles_layers_and_log_prob_kernels_with_equal_results(model_dir, monkeypatch, dynamo_cache):
    """plan.torch_compile is what the workers act on (upstream's use_torch_compile): each decoder layer of the
    actor, reference and critic is compiled before FSDP2 shards it, and the actor compiles its per-chunk
    log-sum-exp, softmax mean and log-prob gradient. Compiled and eager workers give the same log-probs,
    entropies, reference log-probs and updates to float32 rounding (1e-5). The backend is torch.compile's
    "eager" (dynamo's graphs run by torch's kernels): CPU plans never compile, inductor's C++ code generation
    takes minutes, and AOTAutograd's split with checkpointing is tested in tests/utils/test_layer_compile.py;
    the GPU's triton backend is measured by benchmarks/profile_step.py (--variant)."""
    import dataclasses

    from torch._dynamo.utils import counters

    from verl.workers.model_building import layer_compile

    monkeypatch.setattr(layer_compile, "BACKEND", "eager")
    compile_plan = dataclasses.replace(cpu_plan(model_dir), torch_compile=True)
    eager = _actor(model_dir, role="actor_rollout_ref")
    compiled = _actor(model_dir, role="actor_rollout_ref", plan=compile_plan)
    assert eager.actor._kernels is None and compiled.actor._kernels is not None
    assert _compiled_layers(eager.actor_module) == 0
    assert _compiled_layers(compiled.actor_module) == _compiled_layers(compiled.ref_module) == 2
    data = ppo_batch()
    graphs = counters["stats"]["unique_graphs"]
    a, b = eager.compute_log_prob(data), compiled.compute_log_prob(data)
    assert counters["stats"]["unique_graphs"] > graphs
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(b.batch["entropys"][mask], a.batch["entropys"][mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.batch["old_log_probs"], a.batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(compiled.compute_ref_log_prob(data).batch["ref_log_prob"],
                               eager.compute_ref_log_prob(data).batch["ref_log_prob"], atol=1e-5, rtol=1e-5)
    # the update runs the compiled layers (forward and backward), log-sum-exp and log-prob gradient:
    # same loss, gradient norm and weights
    ma = eager.update_actor(_with_old_log_probs(eager, ppo_batch())).meta_info["metrics"]
    mb = compiled.update_actor(_with_old_log_probs(compiled, ppo_batch())).meta_info["metrics"]
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-7), key
    for pa, pb in zip(eager.actor_module.parameters(), compiled.actor_module.parameters()):
        torch.testing.assert_close(whole(pb), whole(pa), atol=1e-6, rtol=1e-5)


def test_compiled_layers_under_fsdp2_mixed_precision_and_autocast_match_eager(model_dir, monkeypatch, dynamo_cache):
    """The a100 plan run on the CPU (bf16 compute under autocast, parameters all-gathered in bf16 by
    FSDP2's mixed-precision policy, float32 master weights): compiled layers give the eager worker's
    log-probs and update (the "eager" backend runs dynamo's graph with the same kernels)."""
    import dataclasses

    from torch._dynamo.utils import counters

    from verl.workers.model_building import layer_compile

    monkeypatch.setattr(layer_compile, "BACKEND", "eager")
    plan = cpu_plan(model_dir, device="a100-80gb")
    assert plan.actor.compute_dtype != "float32" and plan.actor.cast_on_gather
    eager = _actor(model_dir, plan=plan)
    compiled = _actor(model_dir, plan=dataclasses.replace(plan, torch_compile=True))
    assert _compiled_layers(compiled.actor_module) == 2
    data = ppo_batch()
    from torch._dynamo.utils import get_compilation_metrics

    graphs, earlier = counters["stats"]["unique_graphs"], {id(m) for m in get_compilation_metrics()}
    a, b = eager.compute_log_prob(data), compiled.compute_log_prob(data)
    assert counters["stats"]["unique_graphs"] > graphs
    torch.testing.assert_close(b.batch["old_log_probs"], a.batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    # the sharded layers are traced as unwrapped ones: their int attributes (head_dim, ...) are constants, not
    # symbols (layer_compile.trace_as_plain_modules; about 100 symbolic guards per layer graph otherwise)
    layer_graphs = [m.shape_env_guard_count for m in get_compilation_metrics()
                    if m.co_name == "_run" and id(m) not in earlier]
    assert layer_graphs and max(layer_graphs) <= 10, layer_graphs
    ma = eager.update_actor(_with_old_log_probs(eager, ppo_batch())).meta_info["metrics"]
    mb = compiled.update_actor(_with_old_log_probs(compiled, ppo_batch())).meta_info["metrics"]
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-7), key
    # a second step (FSDP2 has resharded and gathered the layers again) runs the graphs it compiled: none more
    graphs = counters["stats"]["unique_graphs"]
    compiled.update_actor(_with_old_log_probs(compiled, ppo_batch()))
    assert counters["stats"]["unique_graphs"] == graphs


def test_planned_torch_compile_compiles_the_critic_layers_with_equal_results(model_dir, monkeypatch, dynamo_cache):
    """As above for the value model: compiled layers give the eager critic's values and update."""
    import dataclasses

    from verl.workers.model_building import layer_compile

    monkeypatch.setattr(layer_compile, "BACKEND", "eager")
    compile_plan = dataclasses.replace(cpu_plan(model_dir), torch_compile=True)
    critics = []
    for plan in (cpu_plan(model_dir), compile_plan):
        critic = CriticWorker(critic_config(model_dir, ppo_mini_batch_size=4), plan=plan)
        critic.init_model()
        batch = ppo_batch()
        batch.batch["values"] = critic.compute_values(batch).batch["values"]
        critics.append((critic, batch.batch["values"], critic.update_critic(batch).meta_info["metrics"]))
    (ce, ve, me), (cc, vc, mc) = critics
    assert _compiled_layers(ce.critic_module) == 0 and _compiled_layers(cc.critic_module) == 2
    torch.testing.assert_close(vc, ve, atol=1e-5, rtol=1e-5)
    assert mc["critic/grad_norm"] == pytest.approx(me["critic/grad_norm"], rel=1e-5)


def test_gradient_checkpointing_stays_in_force_with_compiled_layers_under_fsdp2(model_dir, monkeypatch, dynamo_cache):
    """transformers 5 checkpoints inside a layer's forward, and FSDP2 subclasses the layer when it shards
    it (wrapped again): layer_compile checkpoints the compiled forward itself for such a class, as the
    plan and transformers' per-layer flag say. Measured by what autograd saves during a training forward:
    with checkpointing, well under half of what it saves without."""
    import dataclasses

    from verl.workers.model_building import layer_compile

    monkeypatch.setattr(layer_compile, "BACKEND", "eager")
    plan = cpu_plan(model_dir)
    plan = dataclasses.replace(plan, torch_compile=True,
                               actor=dataclasses.replace(plan.actor, gradient_checkpointing=True))
    worker = _actor(model_dir, plan=plan)
    module = worker.actor_module
    assert _compiled_layers(module) == 2
    ids = ppo_batch().batch["input_ids"]

    def saved_elements() -> int:
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            loss = module(input_ids=ids, use_cache=False).logits.float().pow(2).mean()
        loss.backward()
        return sum(sizes)

    module.train()
    checkpointed = saved_elements()
    module.gradient_checkpointing_disable()
    assert checkpointed < 0.5 * saved_elements()


def test_init_model_sizes_the_schedule_of_workers_started_before_the_data(model_dir):
    """Workers spawned while the driver still filters the data get no total_training_steps in their
    config; init_model(total_training_steps=N) sizes the cosine schedule, and reports its set-up pieces.
    Neither loads the tokenizer, not even to generate (the trainer sends eos/pad ids; a checkpoint save
    loads it), and the two roles of a process share it once loaded."""
    from verl.workers import fsdp_workers

    fsdp_workers._process_tokenizer.cache_clear()
    schedule = {"lr": 1.0, "lr_scheduler_type": "cosine", "total_training_steps": -1}
    actor_optim = {**actor_rollout_ref_config(model_dir).actor.optim, **schedule}
    actor = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, optim=actor_optim), role="actor_rollout",
                                  plan=cpu_plan(model_dir))
    pieces = actor.init_model(total_training_steps=4)
    critic = CriticWorker(critic_config(model_dir, optim={**critic_config(model_dir).optim, **schedule}),
                          plan=cpu_plan(model_dir))
    critic_pieces = critic.init_model(total_training_steps=4)
    for optimizer, scheduler in ((actor.actor_optimizer, actor.actor_lr_scheduler),
                                 (critic.critic_optimizer, critic.critic_lr_scheduler)):
        optimizer.step()
        scheduler.step()
        assert scheduler.get_last_lr()[0] == pytest.approx(0.5 * (1 + 0.5 ** 0.5))  # cos(pi/4): step 1 of 4
    assert {"process_start", "constructor", "model_code", "actor_load", "actor_shard", "actor_optimizer",
            "rollout_engine"} <= set(pieces)
    assert {"model_code", "critic_load", "critic_shard", "critic_optimizer"} <= set(critic_pieces)
    data = ppo_batch(batch_size=2)
    prompts = DataProto.from_dict({k: data.batch[k][:, :PROMPT_LEN] for k in ("input_ids", "attention_mask",
                                                                              "position_ids")},
                                  meta_info={"eos_token_id": 0, "pad_token_id": 0})
    assert actor.generate_sequences(prompts).batch["responses"].shape == (2, RESPONSE_LEN)
    assert fsdp_workers._process_tokenizer.cache_info().currsize == 0      # not loaded at start-up, nor to generate
    assert critic.tokenizer.eos_token_id == actor.tokenizer.eos_token_id is not None
    assert fsdp_workers._process_tokenizer.cache_info().currsize == 1      # one per process and path
