"""Rollout correction (upstream's `verl.trainer.ppo.rollout_corr_helper`): importance weights between the
policy being trained and the rollout engine's policy, computed from their log-prob ratio.

Built here: token- and sequence-level weights, truncated at an upper bound (TIS, threshold "2.0") or zeroed
outside [lower, upper] (IcePop, threshold "0.5_2.0"), optionally normalised to mean 1, with their statistics.
The trainer does not apply them yet, and rejection sampling (`rollout_rs`) and bypass mode are not built: those
names raise NotImplementedError. Log-space throughout; every weight is detached (it changes the measure, not the
objective).
"""
from __future__ import annotations

from typing import Optional

import torch

import verl.utils.torch_functional as verl_F

__all__ = ["SAFETY_BOUND", "compute_rollout_correction_weights", "compute_is_metrics",
           "compute_rollout_rejection_mask", "compute_rs_metrics", "compute_rollout_correction_and_rejection_mask",
           "compute_offpolicy_metrics", "compute_rollout_correction_and_add_to_batch",
           "compute_rollout_corr_metrics_from_logprobs", "apply_bypass_mode"]

SAFETY_BOUND = 20.0  # |log ratio| cap before exponentiating (e^20 ~ 5e8)


def _parse_rollout_is_threshold(spec) -> tuple[float, Optional[float]]:
    """(upper, lower or None) from 2.0, "2.0" or "lower_upper"."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise TypeError("algorithm.rollout_correction.rollout_is_threshold must be a number or a 'lower_upper' string")
    lower = None
    if isinstance(spec, str):
        text = spec.strip()
        try:
            if "_" in text:
                low, high = text.split("_", 1)
                lower, upper = float(low), float(high)
            else:
                upper = float(text)
        except ValueError as exc:
            raise ValueError(f"Invalid rollout_is_threshold '{spec}': use a number or 'lower_upper'") from exc
    else:
        upper = float(spec)
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"Invalid rollout_is_threshold '{spec}': need 0 < lower <= upper")
    return upper, lower


def compute_is_metrics(rollout_is_weights: torch.Tensor, raw_rollout_is_weights: torch.Tensor,
                       response_mask: torch.Tensor, rollout_is_threshold: float,
                       rollout_is_threshold_lower: Optional[float] = None) -> dict[str, float]:
    """Mean / max / min / std of the weights over valid tokens, the fraction of raw weights above the upper
    (below the lower) bound, and the effective sample size 1 / mean(w_normalised^2) as a fraction."""
    valid = response_mask.bool()
    w = rollout_is_weights[valid].double()
    raw = raw_rollout_is_weights[valid].double()
    if w.numel() == 0:
        return {}
    lower = rollout_is_threshold_lower if rollout_is_threshold_lower is not None else 1.0 / rollout_is_threshold
    mean = w.mean()
    normalised = w / mean.clamp_min(1e-8)
    return {"rollout_is_mean": mean.item(), "rollout_is_max": w.max().item(), "rollout_is_min": w.min().item(),
            "rollout_is_std": w.std(unbiased=False).item(),
            "rollout_is_ratio_fraction_high": (raw > rollout_is_threshold).double().mean().item(),
            "rollout_is_ratio_fraction_low": (raw < lower).double().mean().item(),
            "rollout_is_eff_sample_size": (1.0 / normalised.square().mean().clamp_min(1e-12)).item()}


def compute_rollout_correction_weights(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_is: str = "token",
                                       rollout_is_threshold: str | float = 2.0,
                                       rollout_is_batch_normalize: bool = False
                                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """(weights, metrics). `log_ratio` is log pi_train - log pi_rollout per token. "token": exp of each token's
    ratio; "sequence": exp of the sequence's summed ratio on every token. Padding gets weight 0."""
    if rollout_is not in ("token", "sequence"):
        raise ValueError(f"Invalid rollout_is: {rollout_is}. Must be one of {{'token', 'sequence'}}.")
    upper, lower = _parse_rollout_is_threshold(rollout_is_threshold)
    mask = response_mask.to(log_ratio.dtype)
    if rollout_is == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        total = (log_ratio * mask).sum(-1, keepdim=True)
        raw = torch.exp(total.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = compute_is_metrics(weights, raw, response_mask, upper, lower)
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = verl_F.masked_mean(((raw < lower) | (raw > upper)).float(), mask).item()
    weights = weights.detach()
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = verl_F.masked_mean(weights, mask)
        else:
            per_seq = verl_F.masked_mean(weights, mask, axis=-1)
            has_tokens = (mask.sum(-1) > 0).to(weights.dtype)
            mean = (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1e-8)
        factor = mean.item() if mean > 1e-8 else 1.0
        weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights, metrics


def compute_offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: Optional[torch.Tensor],
                              response_mask: torch.Tensor) -> dict[str, float]:
    """How far the rollout policy is from the training policy: the mean k1 and k3 KL estimates and the
    perplexities of both (exp of the mean negative log-prob per sequence, averaged)."""
    if rollout_log_prob is None:
        return {}
    mask = response_mask.to(old_log_prob.dtype)
    delta = old_log_prob - rollout_log_prob   # log pi_train - log pi_rollout
    k1 = verl_F.masked_mean(-delta, mask)
    k3 = verl_F.masked_mean(torch.exp(delta) - 1 - delta, mask)
    ppl = lambda lp: torch.exp(-verl_F.masked_mean(lp, mask, axis=-1)).mean()  # noqa: E731
    return {"training_ppl": ppl(old_log_prob).item(), "rollout_ppl": ppl(rollout_log_prob).item(),
            "kl": k1.item(), "k3_kl": k3.item()}


def _not_built(name: str, what: str):
    def unsupported(*args, **kwargs):
        raise NotImplementedError(f"rollout_corr_helper.{name}: {what} is not supported by this verl; "
                                  "see docs/upstream/compatibility.md")

    unsupported.__name__ = name
    unsupported.__doc__ = f"Upstream's {name}: {what}, not supported here (raises NotImplementedError)."
    return unsupported


compute_rollout_rejection_mask = _not_built("compute_rollout_rejection_mask", "rollout rejection sampling (rollout_rs)")
compute_rs_metrics = _not_built("compute_rs_metrics", "rollout rejection sampling (rollout_rs)")
compute_rollout_correction_and_rejection_mask = _not_built("compute_rollout_correction_and_rejection_mask",
                                                           "rollout rejection sampling (rollout_rs)")
compute_rollout_correction_and_add_to_batch = _not_built("compute_rollout_correction_and_add_to_batch",
                                                         "rollout correction inside the trainer")
compute_rollout_corr_metrics_from_logprobs = _not_built("compute_rollout_corr_metrics_from_logprobs",
                                                        "rollout correction inside the trainer")
apply_bypass_mode = _not_built("apply_bypass_mode", "bypass mode (rollout log-probs as the old policy)")
