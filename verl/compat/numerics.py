"""The half-precision numerics guard: one forward pass in float32 and one under the planned half
dtype, on a real batch, before training starts.

Device rules say float16 is *fast* on a V100 or T4; they cannot say a given model's activations
stay inside float16's range (max 65504). A model that overflows trains on garbage, so the worker
runs this check once and, when it fails, switches the role to float32 with the returned reason.

Metric: the log-probability of each actual next token (what PPO's ratios and KL are built from),
compared over positions where both the token and its successor are real (attention_mask == 1).
The half run fails when any logit there is non-finite, when the largest absolute log-prob
difference exceeds `max_abs` nats, or when the mean exceeds `mean_abs` nats. The defaults (1.0 and
0.05) sit well above float16's rounding noise on a healthy model (~1e-2 nats on average) and well
below what an overflowing one produces; a 0.05-nat mean error is a 5% error in the PPO ratio,
a quarter of the usual 0.2 clip range.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from verl.compat.apply import dtype_name, torch_dtype

MAX_ABS_NATS = 1.0
MEAN_ABS_NATS = 0.05


def _token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, t+1] | prefix) from logits[:, t], in float32: shape [batch, seq-1]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def compare_logits(reference: torch.Tensor, half: torch.Tensor, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, dtype: str = "float16", *,
                   max_abs: float = MAX_ABS_NATS, mean_abs: float = MEAN_ABS_NATS) -> tuple[bool, str]:
    """Judge half-precision logits against float32 ones for the same batch; (ok, reason)."""
    valid = attention_mask.bool()
    if not torch.isfinite(reference[valid]).all():
        raise ValueError("The float32 reference forward itself produced non-finite logits; the "
                         "model or batch is broken, not the half-precision run.")
    bad = int((~torch.isfinite(half[valid])).sum())
    if bad:
        return False, (f"{dtype} forward produced {bad} non-finite logits on a real batch "
                       f"(activations overflow {dtype}); using float32")
    pairs = valid[:, :-1] & valid[:, 1:]
    if not pairs.any():
        raise ValueError("The batch has no pair of consecutive real tokens to compare.")
    diff = (_token_logprobs(reference, input_ids) - _token_logprobs(half, input_ids)).abs()[pairs]
    worst, mean = float(diff.max()), float(diff.mean())
    summary = (f"token log-prob |{dtype} - float32|: max {worst:.3g} nats (limit {max_abs:g}), "
               f"mean {mean:.3g} (limit {mean_abs:g}) over {int(pairs.sum())} tokens")
    if worst > max_abs or mean > mean_abs:
        return False, f"{summary}; using float32"
    return True, summary


@torch.no_grad()
def check_half_precision(model: torch.nn.Module, batch: Mapping, compute_dtype: str | torch.dtype, *,
                         max_abs: float = MAX_ABS_NATS,
                         mean_abs: float = MEAN_ABS_NATS) -> tuple[bool, str]:
    """Forward `batch` (input_ids, attention_mask, optional position_ids) through `model` in float32
    and under autocast to `compute_dtype`; (ok, reason). `model` must hold float32 weights (the
    master copy), otherwise both passes would run in the half dtype and prove nothing."""
    dtype = torch_dtype(compute_dtype)
    name = dtype_name(dtype)
    params = [p for p in model.parameters() if p.is_floating_point()]
    if any(p.dtype != torch.float32 for p in params):
        raise ValueError("check_half_precision needs the model's float32 master weights; got "
                         f"{sorted({str(p.dtype) for p in params})}.")
    device = params[0].device
    inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "position_ids")
              if k in batch.keys() and batch[k] is not None}  # noqa: SIM118 (TensorDict-like batches)
    was_training = model.training
    model.eval()
    try:
        with torch.autocast(device.type, enabled=False):
            reference = model(**inputs, use_cache=False).logits
        with torch.autocast(device.type, dtype=dtype):
            half = model(**inputs, use_cache=False).logits
    finally:
        model.train(was_training)
    return compare_logits(reference, half, inputs["input_ids"], inputs["attention_mask"], name,
                          max_abs=max_abs, mean_abs=mean_abs)
