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

from verl.compat.catalog import get_profile
from verl.compat.model_spec import ModelSpec
from verl.compat.planner import make_plan
from verl.compat.profile import SoftwareInfo
from verl.protocol import DataProto
from verl.workers.rollout import HFRollout
from verl.workers.rollout.hf_rollout import TOP_P_CANDIDATES, candidate_logits

VOCAB, PAD = 64, 0
PROMPTS = [[5, 17, 33, 2], [9, 4, 61, 22, 8, 13, 40], [11], [30, 30, 12, 55, 3]]
SOFTWARE = SoftwareInfo(torch_version=torch.__version__)
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3, tie_word_embeddings=False,
              pad_token_id=PAD)


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
    batch = _batch(PROMPTS, 8, [VOCAB + 1])
    ids, mask, pos = (batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
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
    """The real plan on this GPU (detected software: triton) compiles the decode step with inductor."""
    from verl.compat.detect import detect_profile, detect_software

    device = torch.device("cuda", torch.cuda.current_device())
    model = _model().to(device)
    profile = detect_profile()
    plan = _plan(model, "h200", detect_software(profile), dtype="float32", micro_batch_size=5)
    if plan.rollout.compile_backend is None:
        pytest.skip(plan.reasons["rollout.compile_backend"])
    batch = _batch(PROMPTS * 3, 9, [VOCAB + 1]).to(device)
    compiled = HFRollout(model, _rollout_config(8, do_sample=False), plan=plan)
    eager = HFRollout(model, _rollout_config(8, do_sample=False), plan=None)
    a = compiled.generate_sequences(batch).batch["responses"].cpu()
    b = eager.generate_sequences(batch).batch["responses"].cpu()
    assert torch.equal(a, b)
