"""The half-precision numerics guard, on a tiny real model (CPU autocast) and on injected logits."""
import pytest
import torch

from verl.compat.apply import numerics
from verl.compat.apply.numerics import (
    GUARD_ROWS,
    MAX_ABS_NATS,
    MEAN_ABS_NATS,
    check_half_precision,
    compare_logits,
    guard_sample,
)


@pytest.fixture(scope="module")
def tiny():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = Qwen2ForCausalLM(cfg)
    ids = torch.randint(0, 128, (3, 10))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, :3] = 0
    return model, {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("dtype", ["float16", "bf16"])
def test_healthy_model_passes(tiny, dtype):
    model, batch = tiny
    model.train()
    ok, reason = check_half_precision(model, batch, dtype)
    assert ok, reason
    assert "max" in reason and "mean" in reason and "over 24 tokens" in reason    # 9 + 9 + 6 real next-token pairs
    assert model.training                                   # mode restored


def test_float16_overflow_fails_with_a_reason(tiny):
    model, batch = tiny
    original = model.model.norm.weight.detach().clone()
    with torch.no_grad():
        model.model.norm.weight.mul_(1e6)                   # final hidden states far beyond 65504
    try:
        ok, reason = check_half_precision(model, batch, "fp16")
    finally:
        with torch.no_grad():
            model.model.norm.weight.copy_(original)
    assert not ok
    assert "non-finite" in reason and "float32" in reason


def test_half_weights_are_refused(tiny):
    model, batch = tiny
    with pytest.raises(ValueError, match="float32 master weights"):
        check_half_precision(model.to(torch.float16), batch, "float16")
    model.float()


def batch_logits(seed=0):
    torch.manual_seed(seed)
    logits = torch.randn(2, 6, 11, dtype=torch.float64)
    ids = torch.randint(0, 11, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    return logits, ids, mask


def test_identical_logits_pass_and_metric_counts_real_pairs():
    logits, ids, mask = batch_logits()
    ok, reason = compare_logits(logits, logits.clone(), ids, mask)
    assert ok and "max 0 nats" in reason and "over 8 tokens" in reason    # 5 + 3 real pairs


def test_one_far_off_token_fails_on_max():
    logits, ids, mask = batch_logits()
    half = logits.clone()
    half[0, 2, ids[0, 3]] += 3.0                             # this token's log-prob moves by > 1 nat
    ok, reason = compare_logits(logits, half, ids, mask)
    assert not ok and f"limit {MAX_ABS_NATS:g}" in reason


def test_small_error_everywhere_fails_on_mean():
    logits, ids, mask = batch_logits()
    half = logits.clone()
    half.scatter_add_(-1, ids.roll(-1, dims=1).unsqueeze(-1), torch.full((2, 6, 1), 0.2, dtype=half.dtype))
    ok, reason = compare_logits(logits, half, ids, mask)
    assert not ok and f"limit {MEAN_ABS_NATS:g}" in reason and "using float32" in reason


def test_non_finite_only_counts_on_real_tokens():
    logits, ids, mask = batch_logits()
    half = logits.clone()
    half[1, 0] = float("inf")                                # a padding position: ignored
    assert compare_logits(logits, half, ids, mask)[0]
    half[1, 4, 0] = float("nan")
    ok, reason = compare_logits(logits, half, ids, mask, "float16")
    assert not ok and "1 non-finite logits" in reason


def test_broken_reference_is_an_error_not_a_fallback():
    logits, ids, mask = batch_logits()
    bad = logits.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="float32 reference"):
        compare_logits(bad, logits, ids, mask)


# ------------------------------------------------------------------------------------ bounded memory


def test_guard_sample_takes_the_first_rows_with_real_tokens():
    ids = torch.arange(10).unsqueeze(-1).expand(10, 5).clone()          # row r holds the token r
    mask = torch.ones(10, 5, dtype=torch.long)
    mask[0] = 0                                                          # only padding
    mask[2, :4] = 0                                                      # one real token: no pair
    sample = guard_sample({"input_ids": ids, "attention_mask": mask, "position_ids": None}, rows=4)
    assert sample.keys() == {"input_ids", "attention_mask"}
    assert sample["input_ids"][:, 0].tolist() == [1, 3, 4, 5]
    assert GUARD_ROWS == 4 and guard_sample({"input_ids": ids, "attention_mask": mask})["input_ids"].shape[0] == 4


def test_guard_sample_of_only_padding_is_an_error():
    with pytest.raises(ValueError, match="no pair of consecutive real tokens"):
        guard_sample({"input_ids": torch.ones(3, 4, dtype=torch.long), "attention_mask": torch.zeros(3, 4)})


def test_chunked_token_logprobs_match_float64(monkeypatch):
    """Slices of 3 positions (10 positions: 4 slices, the last one partial) give the float64
    log-softmax to float32 rounding (1e-6 absolute on values of a few nats)."""
    monkeypatch.setattr(numerics, "LOGPROB_CHUNK", 3)
    torch.manual_seed(1)
    logits = torch.randn(2, 10, 11, dtype=torch.float64) * 4
    ids = torch.randint(0, 11, (2, 10))
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    logits[1, 7, 3] = float("inf")
    bad, logp = numerics._reduce(logits, ids)
    assert bad.sum() == 1 and bad[1, 7] == 1 and not torch.isfinite(logp[1, 7])
    assert logp.dtype == torch.float32
    finite = torch.ones_like(expected, dtype=torch.bool)
    finite[1, 7] = False
    torch.testing.assert_close(logp.double()[finite], expected[finite], atol=1e-6, rtol=0)


def test_rows_run_one_at_a_time_cut_to_their_real_tokens(tiny):
    model, batch = tiny
    shapes = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        ok, reason = check_half_precision(model, batch, "float16")
    finally:
        hook.remove()
    assert ok, reason
    assert shapes == [(1, 10), (1, 10), (1, 7), (1, 7), (1, 10), (1, 10)]    # row 1 starts after 3 pads
    assert "over 24 tokens" in reason


def test_trimmed_rows_give_the_logits_of_the_padded_batch(tiny):
    """Cutting the padding off (position ids kept) changes no real token's log-prob: the per-row,
    trimmed guard and one padded float32 pass agree to 1e-5 nats."""
    model, batch = tiny
    model.eval()
    with torch.no_grad():
        padded = model(**batch, use_cache=False).logits
        row = numerics._real_span({**batch, "position_ids": None}, 1)
        trimmed = model(**row, use_cache=False).logits
    _, full = numerics._reduce(padded, batch["input_ids"])
    _, cut = numerics._reduce(trimmed, row["input_ids"])
    torch.testing.assert_close(cut[0], full[1, 3:], atol=1e-5, rtol=0)
    model.train()
