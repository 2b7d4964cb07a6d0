"""The built-in engine's static-cache decoder against transformers' own `generate`, on tiny models.

Greedy output must equal `generate` token for token (left padding, prompts of different lengths, EOS
part-way); sampled tokens must follow the same distribution (checked against an exact float64
distribution, and `generate`'s samples against ours); the candidate filter must keep exactly the
float64 reference's tokens. The engine runs under the real planner's CPU plan.
"""

import dataclasses

import numpy as np
import pytest
import torch
import transformers

from verl.compat.device.catalog import get_profile
from verl.compat.planning.model_spec import ModelSpec
from verl.compat.planning.planner import make_plan
from verl.compat.device.profile import SoftwareInfo
from verl.protocol import DataProto
from verl.workers.rollout import HFRollout
from verl.workers.rollout.hf_rollout import TOP_P_CANDIDATES, candidate_logits

VOCAB, PAD = 64, 0
PROMPTS = [[5, 17, 33, 2], [9, 4, 61, 22, 8, 13, 40], [11], [30, 30, 12, 55, 3]]
SOFTWARE = SoftwareInfo(torch_version=torch.__version__)
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3, tie_word_embeddings=False,
              pad_token_id=PAD)


@pytest.fixture(autouse=True)
def _no_warmed_windows():
    """Each test starts with no window warmed in this process: several reset torch.compile's code, which a
    capture made without a warm-up would then compile under capture."""
    from verl.workers.rollout import static_decoder

    static_decoder._warmed.clear()
    yield
    static_decoder._warmed.clear()


def _model(family="qwen2", seed=0, **extra):
    torch.manual_seed(seed)
    if family == "qwen2":
        cfg = transformers.Qwen2Config(**COMMON, **extra)
        cls = transformers.Qwen2ForCausalLM
    elif family == "qwen3":
        cfg = transformers.Qwen3Config(**COMMON, head_dim=8, **extra)
        cls = transformers.Qwen3ForCausalLM
    else:
        cfg = transformers.LlamaConfig(**COMMON, **extra)
        cls = transformers.LlamaForCausalLM
    cfg._attn_implementation = "sdpa"
    return cls(cfg).float().eval()


def _prompt_tensors(width=8):
    """(input_ids, attention_mask, position_ids) of PROMPTS left-padded to `width`."""
    batch = _batch(PROMPTS, width, [VOCAB + 1])
    return tuple(batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))


def _rollout_config(response_length, **sampling):
    from omegaconf import OmegaConf

    base = {"name": "auto", "dtype": "auto", "gpu_memory_utilization": "auto", "enforce_eager": "auto",
            "micro_batch_size": "auto", "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True,
            "response_length": response_length, "n": 1, "seed": 7, "ignore_eos": False,
            "val_kwargs": {"temperature": 0, "top_k": -1, "top_p": 1.0, "do_sample": False, "n": 1}}
    base.update(sampling)
    return OmegaConf.create(base)


def _plan(model, profile="cpu", software=SOFTWARE, **rollout):
    """The real planner's plan for this model on `profile` (built-in engine)."""
    cfg = {"data": {"train_batch_size": 4, "max_prompt_length": 16, "max_response_length": 8},
           "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2},
                                 "rollout": {"name": "hf", "log_prob_micro_batch_size_per_gpu": 2, **rollout},
                                 "ref": {"log_prob_micro_batch_size_per_gpu": 2}},
           "critic": {"ppo_micro_batch_size_per_gpu": 2},
           "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
           "trainer": {"n_gpus_per_node": 1, "nnodes": 1}}
    return make_plan(get_profile(profile), cfg, software, ModelSpec.from_hf_config(model.config))


def _batch(prompts, width, eos):
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                               meta_info={"eos_token_id": eos, "pad_token_id": PAD})


def _generate_hf(model, batch, steps, eos, **sampling):
    """transformers' `generate` on the same left-padded batch: (rows, steps) with PAD after EOS."""
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=0,
                         eos_token_id=eos, pad_token_id=PAD, **sampling)
    new = out[:, ids.shape[1]:]
    return torch.cat([new, torch.full((len(ids), steps - new.shape[1]), PAD, dtype=new.dtype, device=new.device)], dim=1)


def _engine_forward_calls(model, engine, batch):
    """The engine's output, and how many times it called the HF model's own forward."""
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        out = engine.generate_sequences(batch)
    finally:
        hook.remove()
    return out, len(calls)


# ---------------------------------------------------------------- greedy == generate


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_greedy_equals_transformers_generate(family):
    model = _model(family)
    plan = _plan(model)
    assert plan.rollout.name == "hf" and plan.rollout.cuda_graphs is False  # CPU: eager static decoding
    engine = HFRollout(model, _rollout_config(10, do_sample=False), plan=plan)
    assert engine.static_unsupported() is None

    free = _generate_hf(model, _batch(PROMPTS, 9, [VOCAB + 1]), 10, [VOCAB + 1], do_sample=False)
    eos = int(free[1, 3])  # row 1 stops after its fourth token; other rows may hit it elsewhere or run on
    batch = _batch(PROMPTS, 9, [eos])
    expected = _generate_hf(model, batch, 10, [eos], do_sample=False)
    out, hf_calls = _engine_forward_calls(model, engine, batch)
    assert hf_calls == 0  # the static decoder ran, not the HF forward
    assert torch.equal(out.batch["responses"], expected)
    assert out.batch["response_mask"][1].tolist() == [1] * 4 + [0] * 6
    assert (expected != PAD).sum() > 20  # most rows ran on past row 1's EOS


def test_padding_width_and_chunking_do_not_change_greedy_output():
    model = _model()
    engine = HFRollout(model, _rollout_config(6, do_sample=False, micro_batch_size=3), plan=None)
    narrow = engine.generate_sequences(_batch(PROMPTS, 7, [VOCAB + 1])).batch["responses"]
    wide = engine.generate_sequences(_batch(PROMPTS, 20, [VOCAB + 1])).batch["responses"]
    assert torch.equal(narrow, wide)
    assert torch.equal(narrow, _generate_hf(model, _batch(PROMPTS, 7, [VOCAB + 1]), 6, [VOCAB + 1],
                                            do_sample=False))


def test_sliding_window_model_falls_back_to_the_hf_forward():
    """A window shorter than the sequence changes attention; the static decoder does not model it,
    so the engine must route such a model through the HF forward (and still equal `generate`)."""
    model = _model(use_sliding_window=True, sliding_window=3, max_window_layers=0)
    engine = HFRollout(model, _rollout_config(6, do_sample=False), plan=_plan(model))
    assert "sliding" in engine.static_unsupported()
    batch = _batch(PROMPTS, 9, [VOCAB + 1])
    out, hf_calls = _engine_forward_calls(model, engine, batch)
    assert hf_calls == 6
    assert torch.equal(out.batch["responses"], _generate_hf(model, batch, 6, [VOCAB + 1], do_sample=False))


# ---------------------------------------------------------------- sampling statistics


def _reference_distribution(logits: np.ndarray, temperature, top_k, top_p) -> np.ndarray:
    """float64: temperature, then top-k, then the nucleus of the renormalised top-k distribution."""
    z = logits.astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    if 0 < top_k < len(z):
        order = order[:top_k]
    p = np.exp(z[order] - z[order].max())
    p /= p.sum()
    keep = (np.cumsum(p) - p) < top_p
    out = np.zeros_like(z)
    out[order[keep]] = p[keep] / p[keep].sum()
    return out


def test_sampled_tokens_follow_generates_distribution():
    """6000 samples of a 2-token continuation of one prompt, from our engine and from `generate`.

    First token: each engine's frequencies within 4.5 standard errors (+1/n) of the exact float64
    distribution, total variation below 0.03, nothing outside the top-k/top-p support. Second token
    (through the decode step and its cache): our marginal within 4.5 two-sample standard errors of
    `generate`'s per token, total variation below 1.5x what two samples of one distribution show by
    chance. Seeds are fixed, so the test is deterministic."""
    model = _model(seed=1)
    n, sampling = 6000, dict(temperature=1.7, top_k=12, top_p=0.9)
    prompt = [7, 21, 3, 44]
    batch = _batch([prompt] * n, 5, [VOCAB + 1])
    engine = HFRollout(model, _rollout_config(2, do_sample=True, seed=3, **sampling), plan=_plan(model))
    ours = engine.generate_sequences(batch).batch["responses"]
    torch.manual_seed(5)
    theirs = _generate_hf(model, batch, 2, [VOCAB + 1], do_sample=True, **sampling)

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1].double().numpy()
    p = _reference_distribution(logits, **sampling)
    assert (p > 0.04).sum() >= 4  # a spread-out distribution, so the check has power
    for sample in (ours, theirs):
        f = np.bincount(sample[:, 0].numpy(), minlength=VOCAB) / n
        assert f[p == 0].sum() == 0
        assert np.all(np.abs(f - p) <= 4.5 * np.sqrt(p * (1 - p) / n) + 1 / n)
        assert 0.5 * np.abs(f - p).sum() < 0.03

    f1 = np.bincount(ours[:, 1].numpy(), minlength=VOCAB) / n
    f2 = np.bincount(theirs[:, 1].numpy(), minlength=VOCAB) / n
    pooled = (f1 + f2) / 2
    assert np.all(np.abs(f1 - f2) <= 4.5 * np.sqrt(2 * pooled * (1 - pooled) / n) + 2 / n)
    chance_tv = 0.5 * np.sqrt(4 * pooled * (1 - pooled) / (np.pi * n)).sum()  # E[TV] of two such samples
    assert 0.5 * np.abs(f1 - f2).sum() < 1.5 * chance_tv


# ---------------------------------------------------------------- candidate filter vs float64


def _kept(values, ids):
    keep = torch.isfinite(values)
    if ids is None:
        return [set(torch.nonzero(row).flatten().tolist()) for row in keep]
    return [set(i[k].tolist()) for i, k in zip(ids, keep)]


@pytest.mark.parametrize("shape,top_k,top_p,partial", [
    ("peaked", 0, 0.9, True),      # nucleus inside the top TOP_P_CANDIDATES: no full sort
    ("flat", 0, 0.95, False),      # nucleus wider than the candidates: full-vocabulary fallback
    ("mixed", 0, 0.8, False),      # one flat row sends the whole batch to the fallback
    ("flat", 40, 0.7, True),       # top-k first, nucleus within the renormalised top-k
    ("peaked", 5, 1.0, True),
])
def test_candidate_logits_keep_the_float64_nucleus(shape, top_k, top_p, partial):
    vocab, rows = 3000, 6
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 0.3
    if shape in ("peaked", "mixed"):
        logits[: rows if shape == "peaked" else rows - 1, :30] += 8 + torch.randn(30, generator=g, dtype=torch.float64)
    values, ids = candidate_logits(logits.float(), top_k, top_p)
    assert (ids is not None) == partial
    if partial and top_k == 0:
        assert ids.shape[1] == TOP_P_CANDIDATES
    for row, kept in zip(logits.numpy(), _kept(values, ids)):
        p = _reference_distribution(row, 1.0, top_k, top_p)
        assert kept == set(np.nonzero(p)[0].tolist())
    finite = torch.isfinite(values)
    source = logits.float() if ids is None else logits.float().gather(-1, ids)
    assert torch.equal(values[finite], source[finite])  # kept logits are untouched


# ---------------------------------------------------------------- the plan's choice


def test_plan_turns_cuda_graphs_on_only_where_they_run():
    model = _model()
    cases = {("cpu", "auto"): False, ("p40", "auto"): True, ("h200", "auto"): True, ("h200", True): False,
             ("h200", False): True, ("mi300x", "auto"): False}
    for (device, eager), graphs in cases.items():
        plan = _plan(model, device, enforce_eager=eager)
        assert plan.rollout.cuda_graphs is graphs, (device, eager)
        assert plan.rollout.enforce_eager is not graphs
        assert plan.reasons["rollout.cuda_graphs"] and plan.reasons["rollout.enforce_eager"]
    assert "CPU" in _plan(model, "cpu").reasons["rollout.enforce_eager"]
    assert "HIP" in _plan(model, "mi300x").reasons["rollout.enforce_eager"]
    forced = _plan(model, "cpu", enforce_eager=False)
    assert forced.rollout.cuda_graphs is False and any("enforce_eager=False" in w for w in forced.warnings)
    vllm = make_plan(get_profile("h200"), {"actor_rollout_ref": {"rollout": {"name": "vllm"}}},
                     dataclasses.replace(SOFTWARE, vllm_usable=True, rollout_engines=("hf", "vllm")), None)
    assert vllm.rollout.name == "vllm" and vllm.rollout.cuda_graphs is False


# ---------------------------------------------------------------- CUDA graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_equals_eager_and_generate():
    device = torch.device("cuda", torch.cuda.current_device())
    model = _model().to(device)
    # float32 for an exact comparison; chunks of 5, 5 and 2 rows: the second chunk replays the first's graph
    plan = _plan(model, "h200", dtype="float32", micro_batch_size=5)
    assert plan.rollout.cuda_graphs and plan.rollout.dtype == "float32" and plan.rollout.micro_batch_size == 5
    batch = _batch(PROMPTS * 3, 9, [VOCAB + 1])
    graphs = HFRollout(model, _rollout_config(8, do_sample=False), plan=plan)
    eager = HFRollout(model, _rollout_config(8, do_sample=False), plan=None)
    a = graphs.generate_sequences(batch.to(device)).batch["responses"].cpu()
    b = eager.generate_sequences(batch.to(device)).batch["responses"].cpu()
    assert torch.equal(a, b)
    expected = _generate_hf(model, batch.to(device), 8, [VOCAB + 1], do_sample=False).cpu()
    assert torch.equal(a, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_graph_is_recorded_while_compiled_code_is_built_beside(monkeypatch):
    """While a side thread builds compiled code (verl/utils/compile_beside.py) a capture would be voided by
    its launches: the decoder decodes without recording, with the same output, and records once it is done."""
    from verl.workers.rollout import static_decoder

    device = torch.device("cuda", torch.cuda.current_device())
    model = _model().to(device)
    plan = _plan(model, "h200", dtype="float32", micro_batch_size=5)
    batch = _batch(PROMPTS * 3, 9, [VOCAB + 1]).to(device)
    recorded = []
    record = static_decoder.StaticDecoder._record
    monkeypatch.setattr(static_decoder.StaticDecoder, "_record",
                        lambda self, window: recorded.append(window) or record(self, window))
    expected = HFRollout(model, _rollout_config(8, do_sample=False), plan=None).generate_sequences(batch)
    for building in (True, False):
        monkeypatch.setattr(static_decoder, "building_beside", lambda: building)
        out = HFRollout(model, _rollout_config(8, do_sample=False), plan=plan).generate_sequences(batch)
        assert torch.equal(out.batch["responses"], expected.batch["responses"])
        assert bool(recorded) is not building


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_background_warmup_records_eager_graphs_first_then_builds_then_replays_compiled_ones(monkeypatch):
    """compat.compile_warmup=background on a GPU (verl/utils/compile_beside.py): the first generate call decodes
    the eager step in CUDA graphs (nothing builds yet), the second starts the side thread and decodes without
    recording, the third records the compiled step; every call's greedy tokens equal the plain engine's."""
    from verl.utils.compile_beside import BesideCompiler
    from verl.workers.rollout import static_decoder

    torch._dynamo.reset()
    device = torch.device("cuda", torch.cuda.current_device())
    model = _model().to(device)
    plan = _plan(model, "h200", dtype="float32", micro_batch_size=5)
    assert plan.rollout.cuda_graphs and plan.rollout.compile_backend
    batch = _batch(PROMPTS * 3, 9, [VOCAB + 1]).to(device)
    expected = HFRollout(model, _rollout_config(8, do_sample=False), plan=None).generate_sequences(batch)
    recorded = []
    record = static_decoder.StaticDecoder._record
    monkeypatch.setattr(static_decoder.StaticDecoder, "_record",
                        lambda self, window: recorded.append(window) or record(self, window))
    compiler = BesideCompiler("background")
    rollout = HFRollout(model, _rollout_config(8, do_sample=False), plan=plan, compiler=compiler)
    per_call = []
    for call in range(3):
        recorded.clear()
        with compiler.pass_("gen") as info:
            out = rollout.generate_sequences(batch)
            per_call.append((info.compiled, compiler.building, bool(recorded)))
        assert torch.equal(out.batch["responses"], expected.batch["responses"]), call
        if call == 1:
            assert compiler.wait_built(120)
    assert per_call == [(False, False, True), (False, True, False), (True, False, True)]


# ---------------------------------------------------------------- the compiled decode step


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_compiled_decode_step_equals_eager_with_one_compile_for_every_layer(family):
    """The plan's compile_backend is inductor on a GPU; here a counting backend (no code generation)
    checks what compiling changes: logits equal to the eager step's, and one graph for both layers and
    every step (the layer is an input, so layers do not each compile)."""
    from torch._dynamo.testing import CompileCounter

    from verl.workers.rollout.static_decoder import StaticDecoder

    torch._dynamo.reset()
    model = _model(family)
    ids, mask, pos = _prompt_tensors()
    counter = CompileCounter()
    with torch.no_grad():
        decoders = [StaticDecoder(model, len(PROMPTS), 14, 16, torch.float32, ids.device, compile_backend=b)
                    for b in (None, counter)]
        firsts = [d.prefill(ids, mask, pos) for d in decoders]
        assert torch.equal(firsts[0], firsts[1])
        token = firsts[0].argmax(-1)
        for step in range(5):
            eager, compiled = (d.decode(token, pos[:, -1] + step + 1, ids.shape[1] + step) for d in decoders)
            torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
            token = eager.argmax(-1)
        # a decoder of another shape (fewer rows, a longer cache) reuses the compiled graph
        other = StaticDecoder(model, 2, 20, 22, torch.float32, ids.device, compile_backend=counter)
        other.prefill(ids[:2], mask[:2], pos[:2])
        other.decode(token[:2], pos[:2, -1] + 1, ids.shape[1])
    assert counter.frame_count == 1


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_fused_projections_decode_as_the_modules_do(family):
    """q/k/v (Qwen2's with biases, Llama's without, Qwen3's normalised per head after) and gate/up read from
    the fused copies give the unfused step's logits, eager and traced (one graph for both layers); a layer
    whose projection is not a plain Linear (an adapter) keeps its modules."""
    from torch._dynamo.testing import CompileCounter

    from verl.workers.rollout.static_decoder import StaticDecoder, fuse_projections

    torch._dynamo.reset()
    model = _model(family)
    ids, mask, pos = _prompt_tensors()
    counter = CompileCounter()
    with torch.no_grad():
        decoders = [StaticDecoder(model, len(PROMPTS), 14, 16, torch.float32, ids.device, fused=f, compile_backend=b)
                    for f, b in ((False, None), (True, None), (True, counter))]
        assert decoders[0].fused == [None, None] and all(f is not None for f in decoders[1].fused)
        token = [d.prefill(ids, mask, pos) for d in decoders][0].argmax(-1)
        for step in range(5):
            plain, *fused = (d.decode(token, pos[:, -1] + step + 1, ids.shape[1] + step) for d in decoders)
            for logits in fused:
                torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-5)
            token = plain.argmax(-1)
    assert counter.frame_count == 1
    layer = model.model.layers[0]
    weight, bias, gate_up = fuse_projections(layer, torch.bfloat16)
    assert weight.dtype == gate_up.dtype == torch.bfloat16
    assert weight.shape == (layer.self_attn.q_proj.out_features + 2 * layer.self_attn.k_proj.out_features, 32)
    assert gate_up.shape == (2 * 64, 32) and (bias is None) == (family != "qwen2")
    layer.self_attn.q_proj = torch.nn.Sequential(layer.self_attn.q_proj)   # stands for an adapter's wrapper
    assert fuse_projections(layer, torch.float32) is None


def test_plan_fuses_the_decode_projections_where_the_copies_are_small():
    """The real planner: on a GPU with compiled, recorded decode steps the 0.5B shape's copies (0.44 GiB in bf16)
    are fused and counted in generation; a 7B shape's (7.9 GiB) on a 24 GB card are not; an eager or
    uncompiled step (no CUDA graphs; a P40 without Triton) is not fused."""
    from verl.compat.planning.memory import fused_copy_gb
    from verl.compat.planning.model_spec import BUILTIN_MODELS

    def spec(name):
        fields = dict(BUILTIN_MODELS[name])
        return ModelSpec.from_hf_config(transformers.AutoConfig.for_model(fields.pop("model_type"), **fields))

    cfg = {"data": {"train_batch_size": 8, "max_prompt_length": 256, "max_response_length": 256},
           "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 2},
                                 "rollout": {"name": "hf", "log_prob_micro_batch_size_per_gpu": 2, "n": 4},
                                 "ref": {"log_prob_micro_batch_size_per_gpu": 2}},
           "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
           "trainer": {"n_gpus_per_node": 1, "nnodes": 1}}
    triton = dataclasses.replace(SOFTWARE, triton_usable=True)
    small = make_plan(get_profile("h200"), cfg, triton, spec("qwen2.5-0.5b"))
    assert small.rollout.fused_projections and "one matmul" in small.reasons["rollout.fused_projections"]
    gen = small.memory["phases"]["rollout"]
    assert gen["rollout.fused weights"] == pytest.approx(fused_copy_gb(spec("qwen2.5-0.5b"), "bfloat16"), abs=1e-3)
    assert fused_copy_gb(spec("qwen2.5-0.5b"), "bfloat16") == pytest.approx(24 * 896 * (896 + 256 + 2 * 4864) * 2 / 2**30)
    big = make_plan(get_profile("rtx3090"), cfg, triton, spec("qwen2.5-7b"))
    assert not big.rollout.fused_projections and "exceed 5%" in big.reasons["rollout.fused_projections"]
    eager = make_plan(get_profile("h200"), {**cfg, "actor_rollout_ref": {**cfg["actor_rollout_ref"], "rollout": {
        **cfg["actor_rollout_ref"]["rollout"], "enforce_eager": True}}}, triton, spec("qwen2.5-0.5b"))
    assert not eager.rollout.fused_projections and "compile_backend" in eager.reasons["rollout.fused_projections"]
    assert not make_plan(get_profile("p40"), cfg, triton, spec("qwen2.5-0.5b")).rollout.fused_projections   # no Triton


def test_plan_compiles_the_decode_step_where_triton_and_graphs_are():
    model = _model()
    triton = dataclasses.replace(SOFTWARE, triton_usable=True)

    cases = {("h200", True, "auto"): "inductor", ("a100-40gb", True, "auto"): "inductor",
             ("t4", True, "auto"): "inductor", ("h200", False, "auto"): None, ("h200", True, True): None,
             ("p40", True, "auto"): None, ("cpu", True, "auto"): None}
    for (device, has_triton, eager), backend in cases.items():
        p = _plan(model, device, triton if has_triton else SOFTWARE, enforce_eager=eager)
        assert p.rollout.compile_backend == backend, (device, has_triton, eager)
        assert p.reasons["rollout.compile_backend"]
    assert "per layer" in _plan(model, "h200", triton).reasons["rollout.compile_backend"]
    assert "torch.compile is off" in _plan(model, "p40", triton).reasons["rollout.compile_backend"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_cuda_graph_decode_equals_eager():
    """The real plan on this GPU (detected software: triton) compiles the decode step with inductor and fuses
    its projections (the tiny model's copies are small): greedy tokens equal the plain eager engine's."""
    from verl.compat.device.detect import detect_profile, detect_software

    device = torch.device("cuda", torch.cuda.current_device())
    model = _model().to(device)
    profile = detect_profile()
    plan = _plan(model, "h200", detect_software(profile), dtype="float32", micro_batch_size=5)
    if plan.rollout.compile_backend is None:
        pytest.skip(plan.reasons["rollout.compile_backend"])
    assert plan.rollout.fused_projections, plan.reasons["rollout.fused_projections"]
    batch = _batch(PROMPTS * 3, 9, [VOCAB + 1]).to(device)
    compiled = HFRollout(model, _rollout_config(8, do_sample=False), plan=plan)
    eager = HFRollout(model, _rollout_config(8, do_sample=False), plan=None)
    a = compiled.generate_sequences(batch).batch["responses"].cpu()
    b = eager.generate_sequences(batch).batch["responses"].cpu()
    assert torch.equal(a, b)


# ---------------------------------------------------------------- trimmed padding, decode windows, EOS checks


def _prefill_widths(model, engine, batch):
    """The engine's output and the width of every prefill (a call embedding more than one column)."""
    widths = []
    hook = model.model.embed_tokens.register_forward_pre_hook(
        lambda _m, args: widths.append(args[0].shape[1]) if args[0].shape[1] > 1 else None)
    try:
        out = engine.generate_sequences(batch)
    finally:
        hook.remove()
    return out, widths


def test_trim_keeps_a_rounded_width_of_the_filled_columns():
    from verl.workers.rollout.hf_rollout import trim_common_padding

    mask = torch.zeros(3, 512, dtype=torch.long)
    mask[0, -150:] = mask[1, -40:] = 1  # row 2: all padding
    ids, pos = mask * 7, torch.clamp(mask.cumsum(-1) - 1, min=0)
    kept = trim_common_padding(ids, mask, pos)
    assert [t.shape for t in kept] == [(3, 192)] * 3  # 150 filled columns, rounded up to 64s
    assert all(torch.equal(t, full[:, -192:]) for t, full in zip(kept, (ids, mask, pos)))
    assert trim_common_padding(ids[:, -100:], mask[:, -100:], pos[:, -100:])[0].shape == (3, 100)  # capped
    empty = torch.zeros(2, 9, dtype=torch.long)
    assert trim_common_padding(empty, empty, empty)[0].shape == (2, 9)


@pytest.mark.parametrize("sampling", [dict(do_sample=False), dict(do_sample=True, temperature=1.3, top_k=20)])
def test_trimmed_padding_changes_no_output(monkeypatch, sampling):
    """Prompts left-padded to 20 columns of which only the last 7 are ever filled. Trimmed (multiple 4:
    8 columns kept) and untrimmed (a multiple wider than the prompt keeps all 20) give the same tensors,
    greedy and sampled from one seed; greedy also equals the HF forward path and `generate`."""
    from verl.workers.rollout import hf_rollout

    model = _model()
    batch = _batch(PROMPTS, 20, [VOCAB + 1])
    batch.meta_info["seed"] = 11
    outs, widths = {}, {}
    for multiple in (4, 1000):
        monkeypatch.setattr(hf_rollout, "TRIM_MULTIPLE", multiple)
        engine = HFRollout(model, _rollout_config(9, **sampling), plan=_plan(model))
        outs[multiple], widths[multiple] = _prefill_widths(model, engine, batch)
    assert widths == {4: [8], 1000: [20]}
    trimmed, full = outs[4].batch, outs[1000].batch
    assert set(trimmed.keys()) == set(full.keys()) == {"prompts", "responses", "response_mask", "input_ids",
                                                       "attention_mask", "position_ids"}
    for key in full.keys():
        assert torch.equal(trimmed[key], full[key]), key
    assert torch.equal(trimmed["prompts"], batch.batch["input_ids"])  # the original 20 columns come back
    assert torch.equal(trimmed["attention_mask"][:, :20], batch.batch["attention_mask"])
    assert torch.equal(trimmed["position_ids"][:, :20], batch.batch["position_ids"])
    if not sampling["do_sample"]:
        engine = HFRollout(model, _rollout_config(9, **sampling), plan=_plan(model))
        engine.static_unsupported = lambda: "test: the HF forward over all 20 columns"
        out, hf_calls = _engine_forward_calls(model, engine, batch)
        assert hf_calls == 9 and torch.equal(out.batch["responses"], trimmed["responses"])
        assert torch.equal(trimmed["responses"], _generate_hf(model, batch, 9, [VOCAB + 1], do_sample=False))
    else:
        assert len({tuple(r) for r in trimmed["responses"].tolist()}) == len(PROMPTS)


def test_chunks_of_one_rounded_width_share_one_decoder(monkeypatch):
    """Chunks whose longest prompts are 7 and 5 tokens: kept at exact widths they need two decoders
    (two caches, two sets of graphs); rounded up to a multiple of 4 both are 8 wide and share one."""
    from verl.workers.rollout import hf_rollout

    built = []

    class Counting(hf_rollout.StaticDecoder):
        def __init__(self, *args, **kwargs):
            built.append(args[2])  # the cache length
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(hf_rollout, "StaticDecoder", Counting)
    model = _model()
    results = {}
    for multiple in (1, 4):
        monkeypatch.setattr(hf_rollout, "TRIM_MULTIPLE", multiple)
        built.clear()
        engine = HFRollout(model, _rollout_config(5, do_sample=False, micro_batch_size=2), plan=None)
        results[multiple] = engine.generate_sequences(_batch(PROMPTS, 12, [VOCAB + 1])).batch["responses"]
        results[multiple, "built"] = list(built)
    assert results[1, "built"] == [7 + 5, 5 + 5] and results[4, "built"] == [8 + 5]
    assert torch.equal(results[1], results[4])
    assert torch.equal(results[1], _generate_hf(model, _batch(PROMPTS, 12, [VOCAB + 1]), 5, [VOCAB + 1],
                                                do_sample=False))


def _spy_windows(monkeypatch):
    from verl.workers.rollout.static_decoder import StaticDecoder

    windows = []
    step = StaticDecoder._step

    def spy(self, window, out=None):
        windows.append(window)
        return step(self, window, out)

    monkeypatch.setattr(StaticDecoder, "_step", spy)
    return windows


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_windowed_decode_equals_generate_across_buckets(monkeypatch, family):
    """Windows of 4 slots: a 9-column prompt and 14 new tokens (slots 9..21 written by decode steps)
    attend over 12, 16, 20 and then the whole 23-slot cache; tokens equal `generate`'s."""
    from verl.workers.rollout import static_decoder

    monkeypatch.setattr(static_decoder, "WINDOW_BUCKET", 4)
    windows = _spy_windows(monkeypatch)
    model = _model(family)
    batch = _batch(PROMPTS, 9, [VOCAB + 1])
    out = HFRollout(model, _rollout_config(14, do_sample=False), plan=_plan(model)).generate_sequences(batch)
    assert windows == [12] * 3 + [16] * 4 + [20] * 4 + [23] * 2
    assert torch.equal(out.batch["responses"], _generate_hf(model, batch, 14, [VOCAB + 1], do_sample=False))


def test_a_cache_small_beside_the_weights_is_one_window(monkeypatch):
    """One row and 15 slots (a cache of 3.8 KB against 89 KB of weights, under the 5% share): every step
    attends over the whole cache, so a decoder records one graph, not one per bucket; tokens still equal
    `generate`'s. Four rows (the test above) keep their windows."""
    from verl.workers.rollout import static_decoder

    monkeypatch.setattr(static_decoder, "WINDOW_BUCKET", 4)
    windows = _spy_windows(monkeypatch)
    model = _model()
    batch = _batch(PROMPTS[1:2], 9, [VOCAB + 1])
    out = HFRollout(model, _rollout_config(6, do_sample=False), plan=_plan(model)).generate_sequences(batch)
    assert windows == [9 + 6] * 5
    assert torch.equal(out.batch["responses"], _generate_hf(model, batch, 6, [VOCAB + 1], do_sample=False))


def test_compiled_step_serves_every_window_with_one_compile(monkeypatch):
    """The compiled layer step (dynamic shapes) over windows of 4 slots, up to the whole cache:
    logits equal the eager step's at every step, and one compile serves every window and layer."""
    from torch._dynamo.testing import CompileCounter

    from verl.workers.rollout import static_decoder

    monkeypatch.setattr(static_decoder, "WINDOW_BUCKET", 4)
    torch._dynamo.reset()
    model = _model()
    batch = _batch(PROMPTS, 8, [VOCAB + 1])
    ids, mask, pos = (batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    counter = CompileCounter()
    seen = set()
    with torch.no_grad():
        decoders = [static_decoder.StaticDecoder(model, len(PROMPTS), 22, 24, torch.float32, ids.device,
                                                 compile_backend=b) for b in (None, counter)]
        token = [d.prefill(ids, mask, pos) for d in decoders][0].argmax(-1)
        # the step is handed the whole cache and slices the window itself: a window view as the
        # compiled step's input is written back in full every call (2.5x slower decode on the H200)
        whole, step_fn = [], decoders[1]._layer_step
        decoders[1]._layer_step = lambda layer, x, cos, sin, hidden, keys, *rest: (
            whole.append(any(keys is k for k in decoders[1].keys)), step_fn(layer, x, cos, sin, hidden, keys, *rest))[1]
        for step in range(14):
            seen.add(decoders[0].window(ids.shape[1] + step))
            eager, compiled = (d.decode(token, pos[:, -1] + step + 1, ids.shape[1] + step) for d in decoders)
            torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
            token = eager.argmax(-1)
    assert seen == {12, 16, 20, 22}  # the last is the whole cache
    assert counter.frame_count == 1
    assert len(whole) == 14 * len(model.model.layers) and all(whole)


def _count_checks(monkeypatch):
    calls = []
    check = HFRollout._all_finished

    def counting(*args):
        calls.append(1)
        return check(*args)

    monkeypatch.setattr(HFRollout, "_all_finished", staticmethod(counting))
    return calls


def test_sparse_eos_checks_give_the_same_tokens_with_fewer_syncs(monkeypatch):
    """Every row stops by step ~12 of 40. Asking every step (today's behaviour: EOS_CHECK_EVERY 1) and
    on the sparse schedule give identical outputs, 40 response columns, and the sparse one asks
    fewer times (after steps 0, 1, 3, 7, 15 here)."""
    from verl.workers.rollout import hf_rollout

    model = _model()
    free = _generate_hf(model, _batch(PROMPTS, 9, [VOCAB + 1]), 40, [VOCAB + 1], do_sample=False)
    eos = sorted({int(t) for t in free[:, 12]})  # each row's 13th token ends it (or an earlier one)
    batch = _batch(PROMPTS, 9, eos)
    calls = _count_checks(monkeypatch)
    outs, counts = {}, {}
    for every in (1, 16):
        monkeypatch.setattr(hf_rollout, "EOS_CHECK_EVERY", every)
        calls.clear()
        outs[every] = HFRollout(model, _rollout_config(40, do_sample=False), plan=_plan(model)).generate_sequences(
            batch).batch
        counts[every] = len(calls)
    lengths = outs[16]["response_mask"].sum(-1)
    assert 2 < int(lengths.max()) <= 13 and outs[16]["responses"].shape == (len(PROMPTS), 40)
    for key in outs[1].keys():
        assert torch.equal(outs[1][key], outs[16][key]), key
    assert torch.equal(outs[16]["responses"], _generate_hf(model, batch, 40, eos, do_sample=False))
    assert counts[1] == int(lengths.max())  # one sync per step until the last EOS
    assert counts[16] == 5 < counts[1]


def test_sampling_stream_continues_from_the_last_eos(monkeypatch):
    """Sampled, two chunks drawing from one kept stream: the first chunk stops between checks, so the
    steps it ran past its last EOS drew samples; the stream is rewound to the last EOS, so the second
    chunk's samples are the ones checking every step gives."""
    from verl.workers.rollout import hf_rollout

    model = _model()
    eos = list(range(0, VOCAB, 3))  # a third of the vocabulary ends a row: short responses
    batch = _batch(PROMPTS[:2] + PROMPTS[:2], 9, eos)
    calls = _count_checks(monkeypatch)
    outs, counts = {}, {}
    for every in (1, 16):
        monkeypatch.setattr(hf_rollout, "EOS_CHECK_EVERY", every)
        calls.clear()
        engine = HFRollout(model, _rollout_config(30, do_sample=True, temperature=1.5, micro_batch_size=2),
                           plan=_plan(model, micro_batch_size=2))
        outs[every] = engine.generate_sequences(batch).batch
        counts[every] = len(calls)
    first_stop = int(outs[1]["response_mask"][:2].sum(-1).max())  # steps the first chunk needed
    assert first_stop not in (1, 2, 4, 8, 16, 30)  # it ran on past its last EOS before a check
    assert counts[16] < counts[1]
    for key in outs[1].keys():
        assert torch.equal(outs[1][key], outs[16][key]), key
    assert not torch.equal(outs[16]["responses"][:2], outs[16]["responses"][2:])  # the stream moved on


# ---------------------------------------------------------------- finished rows leave the decoder

# eight prompts whose greedy continuations (no EOS) first hit token 10 or 43 after 3, 3, 6, 3, never, 11, 4 and 9
# tokens: under EOS {10, 43} half the rows have finished at the check after step 3, seven of eight after step 15
MORE_PROMPTS = PROMPTS + [[7, 7, 7], [60, 2, 19, 44, 31, 5, 9], [14, 27], [50, 1, 36, 8]]


def _spy_rows(monkeypatch):
    """The decoder's row count at every decode step."""
    from verl.workers.rollout.static_decoder import StaticDecoder

    rows = []
    step = StaticDecoder._step

    def spy(self, window, out=None):
        rows.append(self.rows)
        return step(self, window, out)

    monkeypatch.setattr(StaticDecoder, "_step", spy)
    return rows


def test_finished_rows_leave_the_decoder_and_change_no_greedy_token(monkeypatch):
    """Two chunks of the eight prompts (one decoder, 30 new tokens each). With finished rows leaving, the
    decoder runs 8 rows, then 4 once half have finished (the check after step 3), then 1 (after step 15:
    the row that never emits EOS), the second chunk starting again from all 8; every output tensor equals
    the one of all rows decoding to the end, and `generate`'s."""
    from verl.workers.rollout import hf_rollout

    model = _model()
    eos = [10, 43]
    batch = _batch(MORE_PROMPTS * 2, 9, eos)
    rows = _spy_rows(monkeypatch)
    outs, seen = {}, {}
    for leave in (True, False):
        monkeypatch.setattr(hf_rollout, "LEAVE_WHEN_HALF_FINISHED", leave)
        rows.clear()
        engine = HFRollout(model, _rollout_config(30, do_sample=False, micro_batch_size=8),
                           plan=_plan(model, micro_batch_size=8))
        outs[leave], seen[leave] = engine.generate_sequences(batch).batch, list(rows)
    for key in outs[False].keys():
        assert torch.equal(outs[True][key], outs[False][key]), key
    assert seen[False] == [8] * 29 * 2
    assert seen[True] == ([8] * 3 + [4] * 12 + [1] * 14) * 2   # 29 decode steps a chunk
    assert torch.equal(outs[True]["responses"], _generate_hf(model, batch, 30, eos, do_sample=False))


def test_rows_left_running_sample_from_their_own_distribution(monkeypatch):
    """3000 rows, two prompts of different lengths taking turns, sampled (temperature 1.3, top-k 40) in the
    plan's chunks; EOS is the first tokens likeliest over both prompts (~60% of the first token's mass), so
    after the first token each chunk's decoder keeps half its rows, the running ones first, their caches
    and positions moved. For every row still running, its second token against the float64 distribution
    after its own prompt and first token (randomised probability integral transform): the transforms are
    uniform (Kolmogorov-Smirnov distance under 1.63 / sqrt(n), the 1% level); a row decoded with another
    row's cache or position would not be. The same seed gives the same tokens again."""
    model = _model(seed=1)
    n, sampling = 3000, dict(temperature=1.3, top_k=40, top_p=1.0)
    prompts = [[7, 21, 3, 44], [9, 50]]
    with torch.no_grad():
        first = np.mean([_reference_distribution(model(input_ids=torch.tensor([p])).logits[0, -1].numpy(), **sampling)
                         for p in prompts], axis=0)
    order = np.argsort(-first)
    eos = sorted(order[:np.searchsorted(np.cumsum(first[order]), 0.6) + 1].tolist())
    batch = _batch(prompts * (n // 2), 5, eos)
    rows = _spy_rows(monkeypatch)

    def sample():
        engine = HFRollout(model, _rollout_config(2, do_sample=True, seed=3, **sampling), plan=_plan(model))
        return engine.generate_sequences(batch).batch["responses"]

    out = sample()
    chunk = _plan(model).rollout.micro_batch_size
    sizes = [min(chunk, n - start) for start in range(0, n, chunk)]
    assert len(sizes) > 1 and rows == [-(-size // 2) for size in sizes]   # one decode step a chunk, on half its rows
    assert torch.equal(out, sample())
    running = [(i % 2, *r) for i, r in enumerate(out.tolist()) if r[0] not in eos]
    assert 0.3 * n < len(running) < 0.45 * n
    prefixes = sorted({r[:2] for r in running})
    with torch.no_grad():
        second = {(p, t): _reference_distribution(model.double()(input_ids=torch.tensor([prompts[p] + [t]])).logits[
            0, -1].numpy(), **sampling) for p, t in prefixes}
    assert all(second[r[:2]][r[2]] > 0 for r in running)
    draws = np.random.default_rng(0).random(len(running))
    pit = np.sort([second[r[:2]][:r[2]].sum() + u * second[r[:2]][r[2]] for r, u in zip(running, draws)])
    grid = np.arange(1, len(pit) + 1) / len(pit)
    assert max(np.abs(grid - pit).max(), np.abs(grid - 1 / len(pit) - pit).max()) < 1.63 / np.sqrt(len(pit))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graphs_recorded_per_row_count_replay_as_eager_decoding():
    """This GPU's plan (graphs; float32 for an exact comparison) on the two chunks of the test above: the
    decoder records a graph per (rows, window) it reaches, 8, 4 and 1 rows, the second chunk replays the
    first's, and greedy tokens equal eager decoding's and `generate`'s."""
    from verl.workers.rollout import static_decoder

    device = torch.device("cuda", torch.cuda.current_device())
    model = _model().to(device)
    plan = _plan(model, "h200", dtype="float32", micro_batch_size=8)
    assert plan.rollout.cuda_graphs
    batch = _batch(MORE_PROMPTS * 2, 9, [10, 43]).to(device)
    recorded = []
    record = static_decoder.StaticDecoder._record

    def spy(self, window):
        recorded.append((self.rows, window))
        return record(self, window)

    static_decoder.StaticDecoder._record = spy
    try:
        out = HFRollout(model, _rollout_config(30, do_sample=False), plan=plan).generate_sequences(batch)
    finally:
        static_decoder.StaticDecoder._record = record
    assert sorted({rows for rows, _ in recorded}) == [1, 4, 8]
    assert len(recorded) == len(set(recorded))   # the second chunk recorded nothing new
    eager = HFRollout(model, _rollout_config(30, do_sample=False), plan=None)
    assert torch.equal(out.batch["responses"].cpu(), eager.generate_sequences(batch).batch["responses"].cpu())
    assert torch.equal(out.batch["responses"].cpu(), _generate_hf(model, batch, 30, [10, 43], do_sample=False).cpu())


def test_kept_rows_decode_as_they_did_with_every_row_through_the_compiled_step():
    """Decoder level: after three steps of six rows, rows 1, 2 and 4 stay; their logits at every later step
    equal those of a decoder that kept all six (eager, 1e-5), through one compiled graph for every row
    count (the kept rows are a view of the buffers' leading rows)."""
    from torch._dynamo.testing import CompileCounter

    from verl.workers.rollout.static_decoder import StaticDecoder

    torch._dynamo.reset()
    model = _model()
    batch = _batch(MORE_PROMPTS[:6], 8, [VOCAB + 1])
    ids, mask, pos = (batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    counter = CompileCounter()
    keep = torch.tensor([1, 2, 4])
    with torch.no_grad():
        full, kept = (StaticDecoder(model, 6, 20, 22, torch.float32, ids.device, compile_backend=b)
                      for b in (None, counter))
        token = full.prefill(ids, mask, pos).argmax(-1)
        kept.prefill(ids, mask, pos)
        for step in range(10):
            if step == 3:
                kept.keep_rows(keep)
                assert kept.rows == 3
            expected = full.decode(token, pos[:, -1] + step + 1, 8 + step)
            rows = keep if step >= 3 else torch.arange(6)
            got = kept.decode(token[rows], pos[rows, -1] + step + 1, 8 + step)
            torch.testing.assert_close(got, expected[rows], rtol=1e-5, atol=1e-5)
            token = expected.argmax(-1)
        assert counter.frame_count == 1
        kept.prefill(ids, mask, pos)   # the next chunk has every row back
        assert kept.rows == 6 and kept.decode(token, pos[:, -1] + 1, 8).shape == (6, VOCAB)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_windowed_graphs_and_compiled_step_equal_eager(monkeypatch):
    """Windows of 4 slots on this GPU's real plan, chunks of 5, 5 and 2 rows: one CUDA graph recorded
    per window and decoder (lazily, one shared pool), replayed by the next equal chunk; greedy tokens
    equal eager decoding and `generate`; where the plan compiles the step, one compile serves every
    window and both chunk sizes."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from verl.compat.device.detect import detect_profile, detect_software
    from verl.workers.rollout import static_decoder

    monkeypatch.setattr(static_decoder, "WINDOW_BUCKET", 4)
    recorded = []
    record = static_decoder.StaticDecoder._record
    monkeypatch.setattr(static_decoder.StaticDecoder, "_record",
                        lambda self, window: (recorded.append(window), record(self, window))[1])
    device = torch.device("cuda", torch.cuda.current_device())
    model = _model().to(device)
    profile = detect_profile()
    plan = _plan(model, "h200", detect_software(profile), dtype="float32", micro_batch_size=5)
    assert plan.rollout.cuda_graphs
    batch = _batch(PROMPTS * 3, 9, [VOCAB + 1]).to(device)
    graphs = HFRollout(model, _rollout_config(20, do_sample=False), plan=plan)
    counter = None
    if plan.rollout.compile_backend is not None:
        torch._dynamo.reset()
        counter = graphs.compile_backend = CompileCounterWithBackend(plan.rollout.compile_backend)
    a = graphs.generate_sequences(batch).batch["responses"].cpu()
    b = HFRollout(model, _rollout_config(20, do_sample=False), plan=None).generate_sequences(batch).batch["responses"]
    assert torch.equal(a, b.cpu())
    assert torch.equal(a, _generate_hf(model, batch, 20, [VOCAB + 1], do_sample=False).cpu())
    # slots 9..27: the 5-row decoder records each window once (the second chunk replays them), the
    # last chunk's 2-row decoder its own
    assert recorded == [12, 16, 20, 24, 28] * 2
    if counter is not None:
        assert counter.frame_count == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_later_rollout_captures_warmed_windows_without_a_warm_up(monkeypatch):
    """On this GPU's real plan, windows of 4 slots: the first generate call runs each window's step twice (warm-up
    and capture); the second, a new decoder, warms up only its first window and captures the others directly;
    both calls give eager decoding's greedy tokens."""
    from verl.compat.device.detect import detect_profile, detect_software
    from verl.workers.rollout import static_decoder

    monkeypatch.setattr(static_decoder, "WINDOW_BUCKET", 4)
    passes = _spy_windows(monkeypatch)
    device = torch.device("cuda", torch.cuda.current_device())
    model = _model().to(device)
    plan = _plan(model, "h200", detect_software(detect_profile()), dtype="float32")
    assert plan.rollout.cuda_graphs
    batch = _batch(PROMPTS, 9, [VOCAB + 1]).to(device)
    rollout = HFRollout(model, _rollout_config(20, do_sample=False), plan=plan)
    first = rollout.generate_sequences(batch).batch["responses"].cpu()
    assert passes == [12, 12, 16, 16, 20, 20, 24, 24, 28, 28]
    passes.clear()
    second = rollout.generate_sequences(batch).batch["responses"].cpu()
    assert passes == [12, 12, 16, 20, 24, 28]
    eager = HFRollout(model, _rollout_config(20, do_sample=False), plan=None).generate_sequences(batch)
    assert torch.equal(first, eager.batch["responses"].cpu())
    assert torch.equal(second, first)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_recording_graphs_again_leaves_no_device_memory_behind():
    """Each generate call records its decoder's graphs afresh; once the first call has set up what the
    process keeps (cuBLAS's workspace for the warm-up stream, compiled code), later calls must end with
    the memory they started with. A new warm-up stream per recording left a cuBLAS workspace behind
    each time (+0.13 to +0.25 GiB a training step on the H200 until torch's 32-stream pool wrapped)."""
    device = torch.device("cuda", torch.cuda.current_device())
    model = _model().to(device)
    plan = _plan(model, "h200", dtype="float32", micro_batch_size=5)
    assert plan.rollout.cuda_graphs
    rollout = HFRollout(model, _rollout_config(8, do_sample=False), plan=plan)
    batch = _batch(PROMPTS * 3, 9, [VOCAB + 1]).to(device)
    rollout.generate_sequences(batch)
    torch.cuda.synchronize()
    settled = torch.cuda.memory_allocated(device)
    for _ in range(4):
        rollout.generate_sequences(batch)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(device) == settled


def test_qwen2_vl_text_prompts_decode_statically_as_the_hf_forward_does(monkeypatch):
    """A tiny Qwen2-VL (head_dim 128: the default mrope sections) on left-padded text prompts with
    (batch, 4, seq) positions: the model's rotary at equal positions is 1-D rotary, and the static path
    (its forward as prefill, then the static step) gives the logits and tokens of its forward at every step."""
    from verl.workers.rollout import hf_rollout
    from verl.workers.rollout.static_decoder import _rotary_table, static_decoding_unsupported

    torch.manual_seed(0)
    text = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, pad_token_id=PAD,
                rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})   # 4.x reads it; 5.x converts it
    cfg = transformers.Qwen2VLConfig(text_config=text, vision_config=dict(depth=1, embed_dim=32, num_heads=2,
                                                                          hidden_size=256))
    cfg._attn_implementation = "sdpa"
    model = transformers.Qwen2VLForConditionalGeneration(cfg).float().eval()
    rotary = model.model.language_model.rotary_emb
    cos = _rotary_table(rotary, 100, torch.float32, torch.device("cpu"), multimodal=True)[0].double()
    tc = cfg.get_text_config()
    theta = (getattr(tc, "rope_parameters", None) or {}).get("rope_theta") or tc.rope_theta   # 5.x / 4.x spelling
    angles = torch.arange(100, dtype=torch.float64)[:, None] * float(theta) ** (-torch.arange(0, 128, 2) / 128)
    torch.testing.assert_close(cos, torch.cat([angles, angles], -1).cos(), rtol=0, atol=1e-4)

    batch = _batch(PROMPTS, 9, [VOCAB + 1])
    batch.batch["position_ids"] = batch.batch["position_ids"][:, None].expand(-1, 4, -1).clone()
    seen = []
    pick = hf_rollout.sample_next_token
    monkeypatch.setattr(hf_rollout, "sample_next_token", lambda logits, *a: seen.append(logits.float()) or pick(logits, *a))
    runs = []
    for forced in (False, True):
        seen.clear()
        engine = HFRollout(model, _rollout_config(10, do_sample=False), plan=None)
        if forced:
            engine.static_unsupported = lambda: "forced: the HF forward path"
        assert forced or engine.static_unsupported() is None
        out, calls = _engine_forward_calls(model, engine, batch)
        runs.append((out.batch["responses"], calls, torch.stack(seen)))
    (static, static_calls, static_logits), (hf, hf_calls, hf_logits) = runs
    assert (static_calls, hf_calls) == (1, 10)
    torch.testing.assert_close(static_logits, hf_logits, rtol=0, atol=1e-4)
    assert torch.equal(static, hf)
    # what still takes the HF forward: sliding-window text layers, VL types not known to place text this way
    model.config.get_text_config().layer_types = ["sliding_attention"] * 2
    assert static_decoding_unsupported(model) == "sliding-window attention layers"
    model.config.model_type = "qwen3_vl"
    assert "vision-language model type 'qwen3_vl'" in static_decoding_unsupported(model)


def _vl_engines(tmp_path, device, plan, response_length):
    """Greedy responses of four geo3k-shaped image prompts (different lengths, left-padded) on a tiny
    Qwen2.5-VL: (static decoder under `plan`, static decoder eager, the HF forward at every step)."""
    from omegaconf import OmegaConf
    from vision_data import geo3k_parquet, tiny_vl_model

    from verl.utils.dataset.rl_dataset import collate_fn, create_rl_dataset
    from verl.workers.model_building.loading import load_processor, load_tokenizer

    model_dir = tiny_vl_model(tmp_path / "vl")
    data = geo3k_parquet(tmp_path / "geo3k", rows_per_split=4)
    dataset = create_rl_dataset(str(data / "train.parquet"), OmegaConf.create({"max_prompt_length": 96}),
                                load_tokenizer(model_dir), load_processor(model_dir))
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa").to(device).eval()
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(4)])).to(device)
    batch.meta_info.update(eos_token_id=-1, pad_token_id=0)   # never stop: every step compared
    config = _rollout_config(response_length, do_sample=False)
    forced = HFRollout(model, config, plan=None)
    forced.static_unsupported = lambda: "forced: the HF forward path"
    engines = (HFRollout(model, config, plan=plan(model)), HFRollout(model, config, plan=None), forced)
    assert engines[0].static_unsupported() is None
    return [e.generate_sequences(batch).batch["responses"].cpu() for e in engines]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_vl_graphs_and_compiled_step_equal_the_hf_forward(tmp_path):
    """A VL model on this GPU's real plan: prefill through its own forward, then the recorded (and, where
    planned, compiled) decode step; greedy tokens equal eager static decoding and the HF forward's."""
    from verl.compat.device.detect import detect_profile, detect_software

    device = torch.device("cuda", torch.cuda.current_device())

    def plan(model):
        p = _plan(model, "h200", detect_software(detect_profile()), dtype="float32", micro_batch_size=2)
        assert p.rollout.cuda_graphs
        return p

    graphs, eager, hf = _vl_engines(tmp_path, device, plan, 24)
    assert torch.equal(graphs, eager) and torch.equal(graphs, hf)


class SymbolicDims:
    """torch.compile backend (no code generation) noting, per graph input, which dimensions compiled as symbols."""

    def __init__(self):
        self.inputs = []

    def __call__(self, gm, example_inputs):
        for node in gm.graph.find_nodes(op="placeholder"):
            value = node.meta.get("example_value")
            if isinstance(value, torch.Tensor):
                self.inputs.append((node.name, tuple(isinstance(d, torch.SymInt) for d in value.shape), value.shape))
        return gm.forward


@pytest.mark.parametrize("fused", [False, True])
def test_compiled_decode_step_keeps_model_constants_out_of_its_symbols(fused):
    """Rows, cache length and window vary between decoders and windows, so they compile as symbols; hidden size,
    heads, head size and the fused weights' shapes are constants (a symbol per constant cost the step's compile
    seconds of symbolic reasoning: docs/performance.md, "Why the code does it this way")."""
    from verl.workers.rollout.static_decoder import StaticDecoder

    torch._dynamo.reset()
    model = _model("qwen2")
    ids, mask, pos = _prompt_tensors()
    seen = SymbolicDims()
    with torch.no_grad():
        decoder = StaticDecoder(model, len(PROMPTS), 14, 16, torch.float32, ids.device, compile_backend=seen, fused=fused)
        decoder.decode(decoder.prefill(ids, mask, pos).argmax(-1), pos[:, -1] + 1, ids.shape[1])
    dims = {name: symbolic for name, symbolic, _ in seen.inputs}
    assert dims["l_x_"] == (True, False, False)                    # rows; one token; hidden size
    assert dims["l_keys_"] == dims["l_values_"] == (True, False, True, False)   # rows, kv heads, slots, head size
    assert dims["l_hidden_"][-1] and dims["l_hidden_"][0]          # the window and the rows
    weights = [symbolic for name, symbolic, _ in seen.inputs if name.startswith("l_fused_")]
    assert len(weights) == (3 if fused else 0) and not any(any(w) for w in weights)   # q/k/v weight and bias, gate/up
    params = [symbolic for name, symbolic, _ in seen.inputs if "parameters" in name]
    assert params and not any(any(p) for p in params)
