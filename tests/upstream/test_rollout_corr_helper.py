"""Rollout-correction importance weights against float64 references: token and sequence level, TIS truncation,
IcePop's band, batch normalisation; thresholds parsed or refused by name."""
import math

import pytest
import torch

from verl.trainer.ppo.rollout_corr_helper import (
    apply_bypass_mode,
    compute_offpolicy_metrics,
    compute_rollout_correction_weights,
)

LOG_RATIO = torch.tensor([[0.1, -0.3, 1.2, 0.0], [0.5, 0.2, 0.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float64)


def test_token_weights_are_truncated_ratios():
    w, metrics = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 2.0)
    expected = [[math.exp(0.1), math.exp(-0.3), 2.0, 0.0], [math.exp(0.5), math.exp(0.2), 0.0, 0.0]]
    assert torch.allclose(w, torch.tensor(expected, dtype=torch.float64), atol=1e-12)
    assert metrics["rollout_is_max"] == pytest.approx(2.0) and metrics["rollout_is_ratio_fraction_high"] == 0.2
    assert not w.requires_grad


def test_sequence_weights_and_icepop_band():
    w, _ = compute_rollout_correction_weights(LOG_RATIO, MASK, "sequence", "0.5_2.5")
    first, second = math.exp(0.1 - 0.3 + 1.2), math.exp(0.7)      # e^1.0 = 2.72 is outside the band -> 0
    assert torch.allclose(w[0], torch.zeros(4, dtype=torch.float64))
    assert torch.allclose(w[1], torch.tensor([second, second, 0, 0], dtype=torch.float64), atol=1e-12)
    assert first > 2.5


def test_batch_normalisation_gives_mean_one():
    w, metrics = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", 10.0, rollout_is_batch_normalize=True)
    # masked_mean divides by (mask sum + 1e-8), hence the 1e-7 tolerance
    assert (w * MASK).sum().item() / MASK.sum().item() == pytest.approx(1.0, abs=1e-7)
    assert metrics["rollout_is_batch_norm_factor"] > 1.0


def test_bad_thresholds_and_levels_say_what_to_change():
    with pytest.raises(ValueError, match="rollout_is_threshold"):
        compute_rollout_correction_weights(LOG_RATIO, MASK, "token", "3_1")
    with pytest.raises(ValueError, match="rollout_is"):
        compute_rollout_correction_weights(LOG_RATIO, MASK, "geometric", 2.0)
    with pytest.raises(NotImplementedError, match="bypass mode"):
        apply_bypass_mode(None, None)


def test_offpolicy_metrics():
    old = torch.log(torch.tensor([[0.5, 0.25]], dtype=torch.float64))
    rollout = torch.log(torch.tensor([[0.25, 0.25]], dtype=torch.float64))
    m = compute_offpolicy_metrics(old, rollout, torch.ones(1, 2))
    d = math.log(2)
    assert m["kl"] == pytest.approx(-d / 2, rel=1e-6) and m["k3_kl"] == pytest.approx((1 - d) / 2, rel=1e-6)
    assert m["rollout_ppl"] == pytest.approx(4.0, rel=1e-6)
