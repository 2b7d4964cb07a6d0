"""The half-precision numerics guard, on a tiny real model (CPU autocast) and on injected logits."""
import pytest
import torch

from verl.compat.numerics import (
    MAX_ABS_NATS,
    MEAN_ABS_NATS,
    check_half_precision,
    compare_logits,
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
