"""verl.utils.torch_functional against plain float64 references written out with Python loops.

Tolerances: float64 inputs are compared at 1e-10; float32 paths at 1e-5 relative; float16 logits
(upcast inside) at 1e-3 against the float64 value of the same half-precision numbers.
"""

import math

import numpy as np
import pytest
import torch

import verl.utils.torch_functional as F

torch.set_num_threads(1)


def _rand(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _mask(rows, cols, lengths):
    m = torch.zeros(rows, cols)
    for i, n in enumerate(lengths):
        m[i, :n] = 1
    return m


# ---------------------------------------------------------------- masked statistics


def test_masked_sum_mean_ignore_nan_outside_mask():
    x = _rand(3, 5)
    m = _mask(3, 5, [5, 2, 0]).double()
    x[1, 3] = float("nan")
    x[2, :] = float("inf")
    total = sum(float(x[i, j]) for i in range(3) for j in range(5) if m[i, j])
    count = float(m.sum())
    assert F.masked_sum(x, m).item() == pytest.approx(total, abs=1e-10)
    assert F.masked_mean(x, m).item() == pytest.approx(total / count, rel=1e-7)
    rows = F.masked_mean(x, m, axis=-1)
    assert rows[0].item() == pytest.approx(float(x[0].sum()) / 5, rel=1e-7)  # 1e-8 guard in the denominator
    assert rows[1].item() == pytest.approx(float(x[1, :2].sum()) / 2, rel=1e-7)
    assert rows[2].item() == 0.0  # an all-masked row gives 0, not NaN


def test_masked_var_and_whiten_match_numpy():
    x = _rand(4, 6, seed=1)
    m = _mask(4, 6, [6, 3, 1, 4]).double()
    vals = np.array([float(x[i, j]) for i in range(4) for j in range(6) if m[i, j]])
    assert F.masked_var(x, m).item() == pytest.approx(vals.var(ddof=1), rel=1e-7)
    assert F.masked_var(x, m, unbiased=False).item() == pytest.approx(vals.var(ddof=0), rel=1e-7)
    w = F.masked_whiten(x, m)
    ref = (x.numpy() - vals.mean()) / math.sqrt(vals.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-7, atol=1e-9)
    w2 = F.masked_whiten(x, m, shift_mean=False)
    np.testing.assert_allclose(w2.numpy(), ref + vals.mean(), rtol=1e-7, atol=1e-9)


def test_masked_var_needs_two_elements():
    with pytest.raises(ValueError, match="at least 2"):
        F.masked_var(torch.ones(1, 3), torch.tensor([[1.0, 0.0, 0.0]]))


def test_clip_by_value_tensor_bounds():
    x = torch.tensor([-3.0, 0.5, 4.0])
    out = F.clip_by_value(x, torch.tensor([-1.0, 1.0, 0.0]), torch.tensor([1.0, 2.0, 3.0]))
    assert out.tolist() == [-1.0, 1.0, 3.0]


# ---------------------------------------------------------------- log-probs and entropy


def _ref_logprob(logits64, labels):
    out = torch.empty(labels.shape, dtype=torch.float64)
    for idx in np.ndindex(*labels.shape):
        row = [float(v) for v in logits64[idx]]
        top = max(row)
        lse = top + math.log(sum(math.exp(v - top) for v in row))
        out[idx] = row[int(labels[idx])] - lse
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 1e-3), (torch.float64, 1e-10)])
def test_logprobs_from_logits_forward(dtype, tol):
    logits = (_rand(2, 3, 17, seed=2) * 4).to(dtype)
    labels = torch.randint(0, 17, (2, 3), generator=torch.Generator().manual_seed(3))
    out = F.logprobs_from_logits(logits, labels)
    assert out.shape == (2, 3)
    assert out.dtype in (torch.float32, torch.float64)  # never half precision
    ref = _ref_logprob(logits.double(), labels)
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


def test_logprobs_from_logits_gradient_and_chunking(monkeypatch):
    monkeypatch.setattr(F, "_ROWS_PER_CHUNK", 4)  # force several chunks
    base = _rand(3, 5, 11, seed=4)
    labels = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(5))
    weights = _rand(3, 5, seed=6)

    x32 = base.float().requires_grad_(True)
    (F.logprobs_from_logits(x32, labels) * weights.float()).sum().backward()

    # float64 reference gradient: d/dx_k [w * (x_y - lse)] = w * (1[k=y] - softmax_k)
    ref = torch.zeros_like(base)
    for i in range(3):
        for t in range(5):
            row = [float(v) for v in base[i, t]]
            top = max(row)
            z = sum(math.exp(v - top) for v in row)
            for k in range(11):
                ref[i, t, k] = float(weights[i, t]) * ((k == int(labels[i, t])) - math.exp(row[k] - top) / z)
    torch.testing.assert_close(x32.grad.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(F.logprobs_from_logits(base.float(), labels).double(), _ref_logprob(base, labels),
                               rtol=1e-5, atol=1e-5)


def test_log_probs_from_logits_response_shifts_by_one():
    logits = _rand(2, 6, 9, seed=7).float()
    ids = torch.randint(0, 9, (2, 6), generator=torch.Generator().manual_seed(8))
    out = F.log_probs_from_logits_response(ids, logits, response_length=3)
    for i in range(2):
        for r in range(3):
            pos = 6 - 3 + r  # token at pos is predicted by logits at pos - 1
            expected = torch.log_softmax(logits[i, pos - 1].double(), -1)[ids[i, pos]]
            assert out[i, r].item() == pytest.approx(expected.item(), abs=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 1e-3)])
def test_entropy_from_logits(dtype, tol):
    logits = (_rand(4, 13, seed=9) * 3).to(dtype)
    ref = []
    for row in logits.double():
        p = torch.softmax(row, -1)
        ref.append(-sum(float(pk) * math.log(float(pk)) for pk in p))
    out = F.entropy_from_logits(logits)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), torch.tensor(ref, dtype=torch.float64), rtol=tol, atol=tol)
    chunked = F.entropy_from_logits_with_chunking(logits, chunk_size=3)
    torch.testing.assert_close(chunked, out)


def test_entropy_gradient_and_chunking_match_float64(monkeypatch):
    """The chunked entropy (forward and its hand-written backward) against float64 autograd, with
    several chunks forced; half-precision input gets a float32 entropy and a gradient in its own dtype."""
    monkeypatch.setattr(F, "_ROWS_PER_CHUNK", 4)
    base = _rand(3, 5, 11, seed=10) * 3
    weights = _rand(3, 5, seed=11)
    x64 = base.double().clone().requires_grad_(True)
    ref = F.entropy_from_logits(x64)   # float64: plain softmax path, the reference
    (ref * weights.double()).sum().backward()
    x32 = base.float().requires_grad_(True)
    out = F.entropy_from_logits(x32)
    (out * weights.float()).sum().backward()
    assert out.dtype == torch.float32 and out.shape == (3, 5)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x32.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)
    x16 = base.half().requires_grad_(True)
    out16 = F.entropy_from_logits(x16)
    out16.sum().backward()
    assert out16.dtype == torch.float32 and x16.grad.dtype == torch.float16
    compiled_like = F.entropy_from_logits(base.float(), kernel=F.entropy_chunk_stats)
    torch.testing.assert_close(compiled_like, out.detach())


def test_logprobs_and_entropy_in_one_pass_match_float64(monkeypatch):
    """Log-probs and entropies from one chunked pass, and the gradient of a mix of both, against
    float64 autograd through log_softmax (several chunks forced)."""
    monkeypatch.setattr(F, "_ROWS_PER_CHUNK", 4)
    base = _rand(3, 5, 11, seed=12) * 4
    labels = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(13))
    w_lp, w_ent = _rand(3, 5, seed=14), _rand(3, 5, seed=15)
    x64 = base.double().clone().requires_grad_(True)
    logp64 = torch.log_softmax(x64, dim=-1)
    ref_lp = logp64.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ref_ent = -(logp64.exp() * logp64).sum(-1)
    ((ref_lp * w_lp).sum() + (ref_ent * w_ent).sum()).backward()
    x32 = base.float().requires_grad_(True)
    lp, ent = F.logprobs_and_entropy(x32, labels)
    ((lp * w_lp.float()).sum() + (ent * w_ent.float()).sum()).backward()
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ent.shape == (3, 5)
    torch.testing.assert_close(lp.double(), ref_lp.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x32.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    # the same numbers as the separate functions, and the float64 path is the reference itself
    torch.testing.assert_close(lp.detach(), F.logprobs_from_logits(base.float(), labels), rtol=0, atol=1e-6)
    lp64, ent64 = F.logprobs_and_entropy(base.double(), labels)
    torch.testing.assert_close(lp64, ref_lp.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent64, ref_ent.detach(), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- masks and padding


def test_get_response_mask_single_and_multiple_eos():
    resp = torch.tensor([[5, 6, 1, 0, 0], [7, 2, 8, 1, 0], [3, 4, 5, 6, 7], [1, 1, 1, 0, 0]])
    assert F.get_response_mask(resp, eos_token=1).tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
        [1, 0, 0, 0, 0],
    ]
    assert F.get_response_mask(resp, eos_token=[1, 2])[1].tolist() == [1, 1, 0, 0, 0]
    assert F.get_response_mask(resp, eos_token=1, dtype=torch.bool).dtype == torch.bool


def test_position_ids_skip_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert F.compute_position_id_with_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_pad_helpers():
    t = torch.tensor([[1, 2], [3, 4]])
    assert F.pad_sequence_to_length(t, 4, 9).tolist() == [[1, 2, 9, 9], [3, 4, 9, 9]]
    assert F.pad_sequence_to_length(t, 4, 9, left_pad=True).tolist() == [[9, 9, 1, 2], [9, 9, 3, 4]]
    assert F.pad_sequence_to_length(t, 1, 9) is t
    assert F.pad_2d_list_to_length([[1], [2, 3]], 0).tolist() == [[1, 0], [2, 3]]
    assert F.pad_2d_list_to_length([[1], [2, 3]], 0, max_length=3).tolist() == [[1, 0, 0], [2, 3, 0]]


def test_postprocess_data_pad_and_truncate():
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    am = torch.ones_like(ids)
    out, m = F.postprocess_data(ids, am, 7, pad_token_id=0)
    assert out.tolist() == [[0, 0, 1, 2, 3, 4, 5]] and m.tolist() == [[0, 0, 1, 1, 1, 1, 1]]
    assert F.postprocess_data(ids, am, 3, 0, truncation="left")[0].tolist() == [[3, 4, 5]]
    assert F.postprocess_data(ids, am, 3, 0, truncation="right")[0].tolist() == [[1, 2, 3]]
    assert F.postprocess_data(ids, am, 3, 0, truncation="middle")[0].tolist() == [[1, 4, 5]]
    with pytest.raises(ValueError, match="max_prompt_length"):
        F.postprocess_data(ids, am, 3, 0, truncation="error")


def test_lr_schedules():
    def lrs(make, steps):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = make(opt)
        out = []
        for _ in range(steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    assert lrs(lambda o: F.get_constant_schedule_with_warmup(o, 2), 4) == pytest.approx([0.0, 0.5, 1.0, 1.0])
    # No warm-up: the full rate from the first step (an LR of 0 there would waste the first update).
    assert lrs(lambda o: F.get_constant_schedule_with_warmup(o, 0), 3) == pytest.approx([1.0, 1.0, 1.0])
    assert lrs(lambda o: F.get_constant_schedule_with_warmup(o, 1), 3) == pytest.approx([0.0, 1.0, 1.0])
    cos = lrs(lambda o: F.get_cosine_schedule_with_warmup(o, 2, 6, min_lr_ratio=0.1), 7)
    ref = [0.0, 0.5] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 4)) for s in range(2, 7)]
    assert cos == pytest.approx(ref)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprob_backward_at_qwen_vocab_equals_the_softmax_formula(monkeypatch, dtype):
    """At Qwen's vocabulary width (151,936), several chunks forced: the log-prob's backward (softmax
    rebuilt in place in one float32 buffer, cast as it is written) equals the plain float32 formula
    g * (1[j=label] - exp(x - lse)) cast to the input dtype (to float32 rounding), and the float64
    gradient to the input dtype's rounding."""
    monkeypatch.setattr(F, "_ROWS_PER_CHUNK", 3)                         # 7 rows: three chunks, one short
    vocab = 151_936
    base = (_rand(7, vocab, seed=21) * 6).to(dtype)
    labels = torch.randint(0, vocab, (7,), generator=torch.Generator().manual_seed(22))
    weights = _rand(7, seed=23) * 3
    x = base.clone().requires_grad_(True)
    (F.logprobs_from_logits(x, labels) * weights).sum().backward()
    assert x.grad.dtype == dtype

    x32 = base.float()
    lse = torch.logsumexp(x32, dim=-1, keepdim=True)
    g = -torch.exp(x32 - lse) * weights.unsqueeze(-1)
    g.scatter_add_(-1, labels.unsqueeze(-1), weights.unsqueeze(-1))
    # float32: two roundings (CPU exp kernels may round a last bit differently in place); bfloat16: the
    # same after the cast but where a float32 ulp straddles a bfloat16 rounding boundary
    tol = 2 ** -22 if dtype == torch.float32 else 2 ** -8
    torch.testing.assert_close(x.grad, g.to(dtype), rtol=tol, atol=0)
    if dtype == torch.bfloat16:
        assert (x.grad != g.to(dtype)).float().mean() < 1e-4

    x64 = base.double()
    lse64 = torch.logsumexp(x64, dim=-1, keepdim=True)
    ref = weights.double().unsqueeze(-1) * (torch.nn.functional.one_hot(labels, vocab).double() - torch.exp(x64 - lse64))
    rel = 1e-5 if dtype == torch.float32 else 2 ** -8
    torch.testing.assert_close(x.grad.double(), ref, rtol=rel, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("entropy", [False, True])
def test_chunked_logprob_scratch_is_two_float32_chunks(monkeypatch, dtype, entropy):
    """The memory model (verl/compat/planning/memory.py, `_logprob_scratch`) counts at most two float32 chunks of scratch
    for the log-prob pass and for its backward; the bytes of every tensor storage created (a
    storage-counting dispatch mode, as benchmarks/memory_model.py measures phases on CPU) stay there."""
    import gc
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "memory_benchmark", Path(__file__).resolve().parents[2] / "benchmarks" / "memory_model.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows_per_chunk, vocab = 16, 20_000
    monkeypatch.setattr(F, "_ROWS_PER_CHUNK", rows_per_chunk)
    chunk = rows_per_chunk * vocab * 4
    x = (_rand(64, vocab, seed=31) * 5).to(dtype).requires_grad_(True)
    labels = torch.randint(0, vocab, (64,), generator=torch.Generator().manual_seed(32))
    resident = {x.untyped_storage().data_ptr()}
    fwd = bench._live_bytes_mode(resident)
    gc.disable()
    try:
        with fwd:
            out = F.logprobs_and_entropy(x, labels) if entropy else (F.logprobs_from_logits(x, labels),)
        loss = sum((o * (i + 1)).sum() for i, o in enumerate(out))
        bwd = bench._live_bytes_mode(resident)
        with bwd:
            loss.backward()
    finally:
        gc.enable()
    grad = x.numel() * x.element_size()
    assert fwd.peak <= 2 * chunk + 64 * 1024, fwd.peak / chunk
    assert bwd.peak - grad <= 2 * chunk + 64 * 1024, (bwd.peak - grad) / chunk


def test_compiled_chunk_kernels_match_float64_and_the_eager_path(monkeypatch):
    """The plan's torch_compile path: compiled log-sum-exp and log-prob gradient per chunk (several chunks
    forced) give float64's log-probs and gradients to float32 rounding (1e-5), as the eager path does
    (the compiled entropy statistics: tests/workers/test_fsdp_workers.py). Compiled with aot_eager: the
    functions' own math through dynamo and AOTAutograd, without inductor's minutes of C++ code generation."""
    monkeypatch.setattr(F, "_ROWS_PER_CHUNK", 4)
    kernels = F.compiled_log_prob_kernels("aot_eager")
    base = _rand(3, 5, 997, seed=41) * 4
    labels = torch.randint(0, 997, (3, 5), generator=torch.Generator().manual_seed(42))
    weights = _rand(3, 5, seed=43)
    x64 = base.clone().requires_grad_(True)
    logp64 = torch.log_softmax(x64, dim=-1)
    ref_lp = logp64.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    (ref_lp * weights).sum().backward()
    outs = {}
    for name, k in (("eager", None), ("compiled", kernels)):
        x = base.float().requires_grad_(True)
        lp = F.logprobs_from_logits(x, labels, kernels=k)
        (lp * weights.float()).sum().backward()
        outs[name] = (lp.detach(), x.grad)
        torch.testing.assert_close(lp.double(), ref_lp.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)
    for a, b in zip(outs["eager"], outs["compiled"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
