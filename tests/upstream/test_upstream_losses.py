"""Loss modes dppo_tv, dppo_kl and dro against float64 references written out per token (tolerance 1e-12)."""
import math

import pytest
import torch

from verl.trainer.ppo.core_algos import get_policy_loss_fn

CONFIG = {"clip_ratio": 0.2, "clip_ratio_low": 0.05, "clip_ratio_high": 0.1, "clip_ratio_c": 3.0,
          "policy_loss": {"dro_beta": 0.5}}


def _inputs():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 2
    new = old + (torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.5) * 0.6
    adv = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.float64)
    mask[2, 3:] = 0
    return old, new, adv, mask


def _token_mean(values, mask):
    return sum(v * m for v, m in zip(values, mask)) / sum(mask)


def _reference(mode, old, new, adv, mask):
    per, flat_mask = [], []
    for o, n, a, m in zip(old.flatten().tolist(), new.flatten().tolist(), adv.flatten().tolist(),
                          mask.flatten().tolist()):
        p, po, r = math.exp(n), math.exp(o), math.exp(n - o)
        if mode == "dro":
            per.append(-(n * a - 0.25 * (n - o) ** 2))
        else:
            if mode == "dppo_tv":
                keep = (p - po <= 0.1) if a > 0 else (p - po >= -0.05)
            else:
                kl = po * (o - n) + (1 - po) * math.log((1 - po + 1e-8) / (1 - p + 1e-8))
                keep = (kl <= 0.1 or p <= po) if a > 0 else (kl <= 0.05 or p >= po)
            per.append(-a * min(r, 3.0) * n * keep)
        flat_mask.append(m)
    return _token_mean(per, flat_mask)


@pytest.mark.parametrize("mode", ["dppo_tv", "dppo_kl", "dro"])
def test_loss_matches_the_per_token_reference(mode):
    old, new, adv, mask = _inputs()
    loss, metrics = get_policy_loss_fn(mode)(old, new, adv, mask, "token-mean", CONFIG)
    assert loss.item() == pytest.approx(_reference(mode, old, new, adv, mask), abs=1e-12)
    # masked_mean divides by (mask sum + 1e-8): the metric agrees to that
    assert metrics["actor/ppo_kl"] == pytest.approx(((old - new) * mask).sum().item() / mask.sum().item(), rel=1e-8)


def test_dppo_masks_tokens_that_left_the_trust_region_and_keeps_gradients_elsewhere():
    old = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    new = torch.log(torch.tensor([[0.7, 0.55]], dtype=torch.float64)).requires_grad_()
    adv = torch.ones(1, 2, dtype=torch.float64)
    loss, metrics = get_policy_loss_fn("dppo_tv")(old, new, adv, torch.ones(1, 2), "token-mean", CONFIG)
    loss.backward()
    assert new.grad[0, 0] == 0 and new.grad[0, 1] != 0     # +0.2 probability is past clip_ratio_high=0.1
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)


def test_dro_needs_a_positive_beta():
    old, new, adv, mask = _inputs()
    with pytest.raises(ValueError, match="dro_beta"):
        get_policy_loss_fn("dro")(old, new, adv, mask, "token-mean", {"policy_loss": {"dro_beta": None}})
