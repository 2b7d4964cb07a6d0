"""The memory model: exact state sizes, the shape of each term, and predictions vs the real workers' CPU peaks.

Measurement (benchmarks/memory_model.py, the same script the GPU run uses): the real planner's plan
drives the real FSDP2 workers; per phase, the bytes of every tensor storage created while it runs (a
TorchDispatchMode that counts each new storage once and uncounts it when freed) plus the storages
resident at its start (weights, grads, optimizer states). That is what `torch.cuda.max_memory_allocated`
reports on a GPU, without the allocator's rounding.
"""
import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from verl.compat.planning.memory import GiB, Workload, _activations, _tokens, estimate_memory, layer_activation_bytes
from verl.compat.planning.model_spec import BUILTIN_MODELS, ModelSpec
from verl.compat.plan import RolePlan, RolloutPlan

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("memory_benchmark", ROOT / "benchmarks" / "memory_model.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

QWEN05 = ModelSpec.from_hf_config(BUILTIN_MODELS["qwen2.5-0.5b"])
TOLERANCE = 0.15     # the project's target for predicted vs measured peak


def role(compute="bfloat16", param="float32", ckpt=False, attn="sdpa", po=False, oo=False, micro=1):
    """A role plan as the planner makes it: cast on gather for bfloat16, not for guarded float16."""
    return RolePlan(param_dtype=param, compute_dtype=compute, grad_scaler=compute == "float16",
                    cast_on_gather=compute not in (param, "float16"), numerics_guard=compute == "float16",
                    attn_implementation=attn, use_remove_padding=False, gradient_checkpointing=ckpt,
                    param_offload=po, optimizer_offload=oo, micro_batch_size_per_gpu=micro,
                    forward_micro_batch_size_per_gpu=micro)


HF = RolloutPlan(name="hf", dtype="bfloat16", gpu_memory_utilization=0.0, enforce_eager=True,
                 attn_implementation="sdpa")
WL = Workload(prompt_length=256, response_length=256, rollout_batch_per_gpu=1)


def estimate(actor, critic=None, ref=None, rollout=HF, workload=WL, memory=80.0):
    return estimate_memory(QWEN05, workload, actor, rollout, critic, ref, device_memory_gb=memory)


# ----------------------------------------------------------------------------- formulas

def test_persistent_state_is_exact():
    est = estimate(role())
    terms = est.phases["actor_update"].terms
    p = QWEN05.num_params
    assert terms["actor.weights"] == pytest.approx(p * 4 / GiB)
    assert terms["actor.grads"] == pytest.approx(p * 4 / GiB)
    assert terms["actor.optimizer"] == pytest.approx(p * 8 / GiB)       # AdamW: two fp32 states


def test_half_master_weights_add_an_fp32_master_copy():
    terms = estimate(role(param="bfloat16")).phases["actor_update"].terms
    assert terms["actor.optimizer"] == pytest.approx(QWEN05.num_params * 12 / GiB)


def test_fsdp_shards_persistent_state():
    one = estimate(role()).phases["actor_update"].terms["actor.optimizer"]
    four = estimate(role(), workload=dataclasses.replace(WL, world_size=4)).phases["actor_update"].terms
    assert four["actor.optimizer"] == pytest.approx(one / 4)


def test_kv_cache_formula_and_rollout_peak():
    m = QWEN05
    per_token = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2 / GiB
    long_answer = estimate(role(), workload=Workload(16, 1024, 64)).phases["rollout"].terms
    assert long_answer["rollout.kv_cache"] == pytest.approx(per_token * 1040 * 64)    # end of decoding
    long_prompt = estimate(role(), workload=Workload(1024, 16, 64)).phases["rollout"].terms
    # prefill peak: the static decoder's cache is allocated whole (prompt + response) before prefill
    assert long_prompt["rollout.kv_cache"] == pytest.approx(per_token * 1040 * 64)
    assert long_prompt["rollout.prefill"] > long_prompt["rollout.kv_cache"]


def test_checkpointing_and_attention_kernels():
    full = layer_activation_bytes(QWEN05, "bfloat16", "float32", "sdpa", 1024)
    eager = layer_activation_bytes(QWEN05, "bfloat16", "float32", "eager", 1024)
    assert eager - full == QWEN05.num_heads * 1024 * (4 + 2)          # the saved T x T scores
    on = _activations(QWEN05, role(ckpt=True), 4096, 1024, train=True)
    off = _activations(QWEN05, role(ckpt=False), 4096, 1024, train=True)
    assert on["activations (checkpointed)"] < off["activations"] / 5


def test_logits_dominate_with_a_large_vocab():
    wl = Workload(512, 512, 4)
    terms = estimate(role(micro=4), workload=wl).phases["log_prob"].terms
    # the pass peaks over the logits, not inside a layer: B x R x V in compute dtype (only response positions
    # reach the LM head) and the log-prob pass's two float32 chunks (a float32 copy and its exponentials)
    assert "activations (1 layer)" not in terms
    v = QWEN05.vocab_size
    assert terms["logits"] == pytest.approx(4 * 512 * v * 2 / GiB)
    assert terms["log-prob scratch"] == pytest.approx(2 * 1024 * v * 4 / GiB)


def test_offloaded_roles_leave_the_device_when_idle():
    critic = role()
    kept = estimate(role(), critic=critic).phases["rollout"].terms
    off = estimate(role(), critic=dataclasses.replace(critic, param_offload=True, optimizer_offload=True))
    assert kept["critic.weights"] > 0 and kept["critic.optimizer"] > 0
    assert off.phases["rollout"].terms["critic.weights"] == 0 == off.phases["rollout"].terms["critic.optimizer"]
    # active under param offload: FSDP2's CPUOffloadPolicy keeps shards, gradients and the AdamW step on the
    # host; the device holds the gathered units, activations and one layer's (or the root's) gradients
    update = off.phases["critic_update"].terms
    assert update["critic.weights"] == 0 == update["critic.optimizer"] and update.get("critic.grads", 0) == 0
    assert update.get("optimizer step", 0) == 0 and update["critic.compute_copy"] > 0
    # optimizer offload alone: the states come over for the step, next to the gradients
    only_opt = estimate(role(), critic=dataclasses.replace(critic, optimizer_offload=True), memory=80.0)
    step_terms = only_opt.phases["critic_update"].terms
    assert only_opt.phases["rollout"].terms["critic.optimizer"] == 0 and step_terms["critic.weights"] > 0


def test_vllm_share_and_context():
    vllm = dataclasses.replace(HF, name="vllm", gpu_memory_utilization=0.4)
    est = estimate(role(), rollout=vllm, memory=24.0)
    assert est.phases["rollout"].terms["rollout.engine share"] == pytest.approx(0.4 * 24.0)
    assert est.required_gb == pytest.approx(est.predicted_peak_gb * 1.05 + est.context_gb)
    assert estimate_memory(QWEN05, WL, role(compute="float32"), HF, device_memory_gb=32,
                           backend="cpu").context_gb == 0
    assert "<- peak" in est.table() and est.to_dict()["peak_phase"] == est.peak_phase


def test_end_of_backward_keeps_the_root_unit_gathered_next_to_the_vocab_gradients():
    """Measured on CPU with the real workers (Qwen shape, 2 layers, float32): backward ends with the
    root unit (the tied embedding) still gathered, the actor's output-projection and embedding
    gradients plus their sum (3x), the critic's embedding gradient plus the copy FSDP2 reduces
    from (2x)."""
    two_layers = ModelSpec.from_hf_config({**BUILTIN_MODELS["qwen2.5-0.5b"], "num_hidden_layers": 2})
    fp32 = role(compute="float32")
    est = estimate_memory(two_layers, Workload(16, 16, 1), fp32, HF, fp32, device_memory_gb=80)
    vh = two_layers.vocab_size * two_layers.hidden_size * 4 / GiB
    actor, critic = est.phases["actor_update"].terms, est.phases["critic_update"].terms
    assert actor["actor.compute_copy"] == pytest.approx(vh) and critic["critic.compute_copy"] == pytest.approx(vh)
    assert actor["vocab grads (end of backward)"] == pytest.approx(3 * vh)
    assert critic["vocab grads (end of backward)"] == pytest.approx(2 * vh)
    assert "logits" not in actor and "optimizer step" not in actor


def test_gradients_exist_at_the_end_of_forward_only_when_a_mini_batch_accumulates():
    """The optimizer step frees the gradients (zero_grad(set_to_none=True)): a mini-batch in one
    micro-batch reaches the end of its forward without them; the second micro-batch of a mini-batch
    of two has them."""
    wl = Workload(256, 128, 8, update_batch_per_gpu=8)
    one = estimate(role(micro=8), workload=wl).phases["actor_update"].terms
    two = estimate(role(micro=4), workload=wl).phases["actor_update"].terms
    assert "activations" in one and "activations" in two          # the end of forward is the peak in both
    assert one["actor.grads"] == 0
    assert two["actor.grads"] == pytest.approx(QWEN05.num_params * 4 / GiB)


def budgeted(plan, tokens=16384):
    """The role with token budgets (use_dynamic_bsz) instead of fixed micro-batches."""
    return dataclasses.replace(plan, use_dynamic_bsz=True, micro_batch_size_per_gpu=None, max_token_len_per_gpu=tokens,
                               forward_micro_batch_size_per_gpu=None, forward_max_token_len_per_gpu=tokens)


def transients(terms):
    """The per-micro-batch terms of a phase (activations, logits, values)."""
    return {k: v for k, v in terms.items() if k.startswith(("activations", "logits", "values"))}


def test_a_token_budget_never_holds_more_than_the_role_is_handed():
    """The GPU matrix's shape: mini-batch 8 x 384 tokens = 3072, budgets 16384. An update micro-batch
    holds at most one mini-batch, a forward micro-batch at most the rollout batch: a budget larger than
    that predicts what one micro-batch of all of it does."""
    wl = Workload(256, 128, 16, update_batch_per_gpu=8)
    big = estimate(budgeted(role()), critic=budgeted(role()), workload=wl)
    whole_mini = estimate(role(micro=8), critic=role(micro=8), workload=wl)
    whole_batch = estimate(role(micro=16), critic=role(micro=16), workload=wl)
    for phase in ("actor_update", "critic_update"):
        assert transients(big.phases[phase].terms) == transients(whole_mini.phases[phase].terms)
    for phase in ("log_prob", "values"):
        assert transients(big.phases[phase].terms) == transients(whole_batch.phases[phase].terms)
    # 8 full-length sequences' activations in every layer (plus the one recomputed), not 16384 tokens'
    # (the residual stream is as wide as the weights compute: bfloat16 when they are gathered in it)
    residual = "bfloat16" if role().cast_on_gather else "float32"
    per_token = layer_activation_bytes(QWEN05, "bfloat16", residual, "sdpa", 384)
    assert big.phases["actor_update"].terms["activations"] == pytest.approx(8 * 384 * per_token * 25 / GiB)


def test_a_budget_smaller_than_the_mini_batch_still_bounds_the_micro_batch():
    wl = Workload(256, 128, 16, update_batch_per_gpu=8)
    two_rows = estimate(budgeted(role(), tokens=2 * 384), workload=wl).phases["actor_update"].terms
    assert transients(two_rows) == transients(estimate(role(micro=2), workload=wl).phases["actor_update"].terms)


def test_a_fixed_micro_batch_larger_than_the_mini_batch_holds_the_mini_batch():
    wl = Workload(256, 128, 16, update_batch_per_gpu=4)
    assert transients(estimate(role(micro=8), workload=wl).phases["actor_update"].terms) == \
        transients(estimate(role(micro=4), workload=wl).phases["actor_update"].terms)


def test_the_critic_is_bounded_by_its_own_mini_batch():
    wl = Workload(256, 128, 16, update_batch_per_gpu=8, critic_update_batch_per_gpu=4)
    assert _tokens(budgeted(role()), wl, "critic", forward=False) == (4 * 384, 4 * 128, 4)
    assert _tokens(budgeted(role()), wl, "actor", forward=False) == (8 * 384, 8 * 128, 8)
    assert _tokens(budgeted(role()), wl, "critic", forward=True) == (16 * 384, 16 * 128, 16)
    assert Workload(256, 128, 16, update_batch_per_gpu=8).sequences_seen("critic", forward=False) == 8
    assert Workload(256, 128, 6, update_batch_per_gpu=8).sequences_seen("actor", forward=False) == 6


# ----------------------------------------------------------------------------- against the real workers

@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """Big enough that each phase's peak is ~60 MiB (the plan's terms are kept to 0.1 MiB)."""
    from verl.utils.tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(str(tmp_path_factory.mktemp("memory_small")), hidden_size=256, num_layers=2,
                                intermediate_size=1024, num_heads=4, num_kv_heads=2, vocab_size=512)


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_real_workers_every_phase_within_tolerance(small_model):
    """The real planner's CPU plan drives the real actor/ref and critic workers (FSDP2, float32) through
    every phase; each measured peak is within 15% of the plan's. Validation generates 4 prompts in the
    plan's chunks of 2 (a user value the plan keeps), so its generation memory is the training
    rollout's 2 rows, not 4."""
    result = bench.run_case("cpu", "tiny", "ppo", small_model, val_rows=4,
                            extra=("algorithm.use_kl_in_reward=True", "actor_rollout_ref.rollout.micro_batch_size=2"))
    assert result["rollout_micro_batch_size"] == 2 and result["validation_rows"] == 4
    assert set(result["measured"]) == set(bench.PHASES), result["errors"]
    for phase, measured in result["measured"].items():
        predicted = result["predicted"][phase]
        assert abs(predicted - measured) <= TOLERANCE * measured, (phase, predicted, measured, result["terms"][phase])

    def generation(phase):           # what the phase allocated on top of the resident state
        return result["measured"][phase] - result["at_start"][phase]

    assert generation("validation") == pytest.approx(generation("rollout"), rel=0.25)
    assert generation("validation") < 1.5 * generation("rollout")     # 4 rows at once would be ~2x


def test_script_end_to_end_on_cpu(tmp_path, capsys):
    """`benchmarks/memory_model.py --tiny --in-process` plans, runs and reports every GRPO phase."""
    rc = bench.main(["--tiny", "--profiles", "cpu", "--settings", "tiny", "--algos", "grpo", "--val-rows", "2",
                     "--in-process", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    report = json.loads((tmp_path / "memory_model.json").read_text())
    (case,) = report["cases"]
    phases = {"rollout", "log_prob", "ref", "actor_update", "validation"}       # GRPO: no critic phases
    assert set(case["measured"]) == phases and set(case["predicted"]) == phases
    assert all(case["measured"][p] > case["at_start"][p] > 0 for p in phases)
    rows = [line.split() for line in out.splitlines() if line.startswith("cpu ")]
    assert sorted(r[3] for r in rows) == sorted(phases)
    assert all(float(r[4]) > 0 and float(r[5]) > 0 and r[6].endswith("%") for r in rows)
    assert "calibration (verl/compat/planning/memory.py):" in out and report["calibration"]


# ----------------------------------------------------------------------------- built-in rollout chunks

def test_rollout_phase_is_one_chunk_of_linear_per_sequence_cost():
    """Generation memory is linear in the sequences generated together; the phase counts one chunk."""
    from verl.compat.planning.memory import ENGINE_TERMS, generation_bytes_per_sequence

    actor = role(compute="float32")
    fp32 = dataclasses.replace(HF, dtype="float32")
    per_seq = generation_bytes_per_sequence(QWEN05, actor, fp32, 256, 256)
    val = Workload(256, 256, 1319)                     # the whole GSM8K test set in one call

    def engine(micro, workload=val):
        terms = estimate(actor, rollout=dataclasses.replace(fp32, micro_batch_size=micro), workload=workload)
        return sum(v for k, v in terms.phases["rollout"].terms.items() if k in ENGINE_TERMS)

    assert engine(64) == pytest.approx(64 * per_seq / GiB)
    assert engine(None) == pytest.approx(1319 * per_seq / GiB)          # no chunking: the whole batch
    assert engine(4096) == engine(None)                                 # a chunk never exceeds the batch
    # prefill dominates at 256+256 in float32: the whole KV cache (allocated before prefill) plus
    # 4H*4 + 3I*4 bytes per prompt token
    m = QWEN05
    kv = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 4
    assert per_seq == 512 * kv + 256 * (4 * m.hidden_size * 4 + 3 * m.intermediate_size * 4)


def test_room_and_resident_during_rollout():
    critic = role()
    est = estimate(role(), critic=critic, memory=24.0)
    terms = est.phases["rollout"].terms
    assert est.rollout_resident_gb() == pytest.approx(
        sum(v for k, v in terms.items() if not k.startswith("rollout."))
        + terms["rollout.weights"] + terms["rollout.gathered weights"])
    room = est.room_gb(24.0)
    assert room * (1 + est.fragmentation) + est.context_gb == pytest.approx(24.0)   # inverse of required_gb


def test_generation_gathers_the_whole_actor_in_its_gather_dtype():
    """The actor worker unshards the whole FSDP2 model to generate: a full copy next to the shards,
    in the compute dtype when it casts on gather (bfloat16), else in float32 plus autocast's cast of
    the output projection (float16 compute, whose numerics guard may fall back at run time)."""
    p = QWEN05.num_params
    bf16 = estimate(role()).phases["rollout"].terms
    assert bf16["rollout.gathered weights"] == pytest.approx(p * 2 / GiB) and bf16["rollout.weights"] == 0
    fp16 = estimate(role(compute="float16"), rollout=dataclasses.replace(HF, dtype="float16")).phases["rollout"].terms
    assert fp16["rollout.gathered weights"] == pytest.approx(p * 4 / GiB)
    # autocast without its weight cache: one weight cast at a time, the output projection the largest
    assert fp16["rollout.weights"] == pytest.approx(QWEN05.vocab_size * QWEN05.hidden_size * 2 / GiB)
    fp32 = estimate(role(compute="float32"), rollout=dataclasses.replace(HF, dtype="float32")).phases["rollout"].terms
    assert fp32["rollout.gathered weights"] == pytest.approx(p * 4 / GiB) and fp32["rollout.weights"] == 0


def test_validation_is_a_phase_of_one_chunk_or_the_whole_val_batch():
    """Validation generates `val_batch_per_gpu` sequences in the plan's chunks; unknown (the whole
    validation set, `data.val_batch_size` null) counts one full chunk."""
    from verl.compat.planning.memory import ENGINE_TERMS

    actor, chunked = role(compute="float32"), dataclasses.replace(HF, dtype="float32", micro_batch_size=512)

    def engine(phase, workload):
        terms = estimate(actor, rollout=chunked, workload=workload).phases[phase].terms
        return sum(v for k, v in terms.items() if k in ENGINE_TERMS)

    unknown = Workload(256, 256, 1)
    assert engine("validation", unknown) == pytest.approx(512 * engine("rollout", unknown))
    assert engine("validation", dataclasses.replace(unknown, val_batch_per_gpu=8)) == \
        pytest.approx(8 * engine("rollout", unknown))
    est = estimate(actor, rollout=chunked, workload=unknown)
    assert est.peak_phase == "validation" and est.predicted_peak_gb == est.phases["validation"].total_gb


def test_plan_peak_covers_validation_on_the_field_report():
    """The simulated-P40 field report (batch 1, 256+256) measured 18.97 GB after its first validation
    (the whole GSM8K test set in chunks of the plan's size) while the plan said 14.72: the plan's
    peak now includes that validation chunk, and the chunk still fits the device."""
    from verl.compat.device.catalog import get_profile
    from verl.compat.planning.planner import make_plan
    from verl.compat.device.profile import SoftwareInfo

    cfg = {"data": {"train_batch_size": 1, "max_prompt_length": 256, "max_response_length": 256},
           "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 1, "ppo_micro_batch_size_per_gpu": 1},
                                 "rollout": {"name": "hf", "log_prob_micro_batch_size_per_gpu": 1},
                                 "ref": {"log_prob_micro_batch_size_per_gpu": 1}},
           "critic": {"ppo_micro_batch_size_per_gpu": 1}, "algorithm": {"adv_estimator": "gae"}}
    p40 = get_profile("p40")
    plan = make_plan(p40, cfg, SoftwareInfo(torch_version=torch.__version__), QWEN05)
    assert plan.memory["peak_phase"] == "validation"
    assert plan.predicted_peak_gb == pytest.approx(18.97, rel=TOLERANCE)
    assert plan.memory["required_gb"] <= p40.memory_gb
    assert plan.rollout.predicted_peak_gb == plan.predicted_peak_gb
    small = make_plan(p40, {**cfg, "data": {**cfg["data"], "val_batch_size": 4}},
                      SoftwareInfo(torch_version=torch.__version__), QWEN05)
    assert small.memory["phases_total"]["validation"]["total_gb"] < plan.memory["phases_total"]["validation"]["total_gb"]
    assert small.predicted_peak_gb < plan.predicted_peak_gb


def test_builtin_engine_under_autocast_casts_one_weight_at_a_time():
    """The built-in engine on float32 weights computing in bfloat16 (what a guarded float16 actor
    does on a GPU; CPU autocast takes bfloat16): autocast runs without its weight cache, so generating
    allocates the output projection's cast once, not a cast copy of every weight. Measured on the
    real engine with the storage counter; the plan's generation terms within 25%."""
    import types

    from omegaconf import OmegaConf
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.compat.planning import memory
    from verl.protocol import DataProto
    from verl.workers.rollout import HFRollout

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=8192, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg).float().eval()
    spec = ModelSpec.from_hf_config(cfg.to_dict())
    rollout_plan = dataclasses.replace(HF, dtype="bfloat16")
    engine = HFRollout(model, OmegaConf.create({"response_length": 4, "ignore_eos": True, "do_sample": False}),
                       plan=types.SimpleNamespace(rollout=rollout_plan))
    ids = torch.randint(1, 8192, (1, 64))
    prompts = DataProto.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                   "position_ids": torch.arange(64)[None]}, meta_info={"eos_token_id": 0})
    start, peak = bench.measure(lambda: engine.generate_sequences(prompts), torch.device("cpu"), [model])
    measured = (peak - start) * GiB

    actor = role(compute="float16")                   # float32 master weights, not cast on gather
    weights = memory._generation_weights(spec, memory._Role("actor", actor, spec.num_params, True), rollout_plan)
    predicted = weights["rollout.weights"] + memory.generation_bytes_per_sequence(spec, actor, rollout_plan, 64, 4)
    assert weights["rollout.weights"] == spec.vocab_size * spec.hidden_size * 2
    assert measured == pytest.approx(predicted, rel=0.25)
    assert measured < 0.75 * spec.num_params * 2      # a cached cast of every weight would be more


def test_prefill_transients_follow_the_weights_the_engine_computes_with():
    """The prefill formula was measured with float32 weights under bfloat16 autocast (4H*4 + 3I*2 + 4I
    per prompt token). A plan that casts on gather generates with bfloat16 weights and no autocast:
    4H*2 + 3I*2. A guarded float16 actor (float32 gathered, autocast) keeps the autocast form."""
    from verl.compat.planning.memory import _generation_terms

    m, bf16, fp16 = QWEN05, dataclasses.replace(HF, dtype="bfloat16"), dataclasses.replace(HF, dtype="float16")
    h, i = m.hidden_size, m.intermediate_size
    cast_on_gather = _generation_terms(m, role(), bf16, 256, 128)[0]["rollout.prefill"]
    assert role().cast_on_gather and cast_on_gather == 256 * (4 * h * 2 + 3 * i * 2)
    guarded = _generation_terms(m, role(compute="float16"), fp16, 256, 128)[0]["rollout.prefill"]
    assert not role(compute="float16").cast_on_gather and guarded == 256 * (4 * h * 4 + 3 * i * 2 + 4 * i)


def test_autocast_caches_the_casts_of_trained_weights_only():
    """torch's autocast caches the cast of a leaf weight that requires grad (in grad mode or not), and
    casts a frozen weight op by op: measured here with the storage counter. So under float16 autocast
    over float32 weights (a guarded t4/v100 plan) the actor's forward holds a cast copy of its weights,
    the frozen reference's only the largest weight's cast (the output projection)."""
    from verl.compat.planning import memory

    def transient(requires_grad):
        layers = torch.nn.Sequential(*[torch.nn.Linear(256, 256, bias=False) for _ in range(8)])
        layers.requires_grad_(requires_grad)
        x = torch.randn(2, 256)

        def forward():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                layers(x)
        start, peak = bench.measure(forward, torch.device("cpu"), [layers])
        return (peak - start) * GiB

    one_weight = 256 * 256 * 2
    assert transient(True) >= 8 * one_weight and transient(False) < 2 * one_weight

    guarded = role(compute="float16")
    actor = memory._Role("actor", guarded, QWEN05.num_params, True)
    ref = memory._Role("ref", guarded, QWEN05.num_params, False)
    vh = QWEN05.vocab_size * QWEN05.hidden_size
    cached = memory._compute_copy(QWEN05, actor, "float16") - memory._compute_copy(QWEN05, ref, "float16")
    assert cached == pytest.approx((QWEN05.num_params - vh) * 2)


def test_few_wide_layers_and_a_small_vocabulary_peak_inside_backward():
    """The test model of `test_real_workers_every_phase_within_tolerance` (2 layers, vocab 512): each layer
    is half the model, so a layer's backward (its unsharded gradients and FSDP2's flat copy of them,
    next to the gathered units) is the update's peak, not the vocabulary-sized end of backward."""
    small = ModelSpec.from_hf_config({"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 1024,
                                      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                      "vocab_size": 512, "tie_word_embeddings": True})
    fp32 = role(compute="float32")
    terms = estimate_memory(small, Workload(16, 4, 2), fp32, HF, device_memory_gb=8).phases["actor_update"].terms
    per_layer = (small.num_params - 512 * 256) / 2
    assert terms["layer grads (backward)"] == pytest.approx(2 * per_layer * 4 / GiB)
    assert terms["actor.grads"] == pytest.approx(small.num_params * 4 / GiB)
