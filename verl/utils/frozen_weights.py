"""Frozen weights stored in half precision, computed in float32 (the plan's `frozen_dtype` on a P40-class card).

A weight that never trains (a LoRA base, the reference model) only needs to be read. Stored in float16 it
takes half the memory; on a device whose plan computes in float32 every matmul still runs in float32.
Two places do the upcast, one per way a model runs:

* Wrapped in FSDP2: the mixed-precision policy casts each unit's parameters to the compute dtype when
  it gathers them (`fsdp_utils.shard_model` sets it whenever a model holds more than one storage dtype),
  so one decoder layer at a time exists in float32, and only while it runs.
* Unwrapped (one device, `RolePlan.fsdp` False): `upcast_frozen` below swaps the forward of each frozen
  linear layer and embedding for one that casts the stored weight to float32 right at the matmul. The
  float32 copy lives for that one call; backward keeps the half-precision weight and casts it again, so
  no float32 copy of a layer is held from forward to backward. Norm weights need nothing: float16 times
  float32 activations promotes to float32.

Per-call casts rather than FSDP2 on one device: wrapping only to cast would add FSDP2's gather copies
and hooks to every pass of an unsharded model.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

COMPUTE_DTYPE_ATTR = "_verl_frozen_compute_dtype"


class _UpcastLinear(torch.autograd.Function):
    """`x @ W.T + b` with W cast to `dtype` for the product only; W is frozen (no gradient)."""

    @staticmethod
    def forward(ctx, x, weight, bias, dtype):
        ctx.save_for_backward(weight)
        ctx.dtype = dtype
        return F.linear(x, weight.to(dtype), None if bias is None else bias.to(dtype))

    @staticmethod
    def backward(ctx, grad):
        (weight,) = ctx.saved_tensors
        return grad @ weight.to(ctx.dtype), None, None, None


def _linear_forward(module: nn.Linear, dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    return _UpcastLinear.apply(x.to(dtype), module.weight, module.bias, dtype)


def _embedding_forward(module: nn.Embedding, dtype: torch.dtype, ids: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, module.weight, module.padding_idx).to(dtype)


def upcast_frozen(model: nn.Module, compute_dtype: torch.dtype) -> int:
    """Make every frozen linear layer and embedding of `model` whose weight is stored in another floating
    dtype compute in `compute_dtype` (see the module docstring); returns how many were changed. Records
    the compute dtype on the model, where the built-in rollout engine reads it."""
    changed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, nn.Parameter) or weight.requires_grad or not weight.is_floating_point() \
                or weight.dtype == compute_dtype:
            continue
        if type(module) is nn.Linear:
            module.forward = functools.partial(_linear_forward, module, compute_dtype)
        elif type(module) is nn.Embedding:
            module.forward = functools.partial(_embedding_forward, module, compute_dtype)
        else:
            continue
        changed += 1
    if changed:
        setattr(model, COMPUTE_DTYPE_ATTR, compute_dtype)
    return changed


def compute_dtype_of(model: nn.Module) -> torch.dtype:
    """The dtype `model` computes in without autocast: the upcast dtype where `upcast_frozen` ran,
    else the dtype of its first parameter."""
    recorded = getattr(model, COMPUTE_DTYPE_ATTR, None)
    return recorded if recorded is not None else next(model.parameters()).dtype


__all__ = ["compute_dtype_of", "upcast_frozen"]
