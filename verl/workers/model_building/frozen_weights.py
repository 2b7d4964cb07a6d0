"""Frozen weights stored in half precision, computed in float32 (the plan's `frozen_dtype` on a P40-class card).

A weight that never trains (a LoRA base, the reference model) only needs to be read. Stored in float16 it
takes half the memory; on a device whose plan computes in float32 every matmul still runs in float32.
Two places do the upcast, one per way a model runs:

* Wrapped in FSDP2: the mixed-precision policy casts each unit's parameters when it gathers them
  (`fsdp_utils.shard_model` sets it whenever a model holds more than one storage dtype) to the dtype
  the plan gathers in (float32 param dtype, or the compute dtype where it casts on gather), so one
  decoder layer at a time exists upcast, and only while it runs.
* Unwrapped (one device, `RolePlan.fsdp` False): `upcast_frozen` below turns each frozen half-precision
  linear layer and embedding into a subclass whose forward, outside autocast, casts the stored weight to
  float32 right at the matmul. The float32 copy lives for that one call; backward keeps the
  half-precision weight and casts it again, so no float32 copy of a layer is held from forward to
  backward. Norm weights need nothing: float16 times float32 activations promotes to float32. Under
  autocast (half-precision compute) the layers run as any half weight does; outside it (a float32
  device, the fp16 numerics guard's float32 pass, its float32 fallback) they compute in float32.

Per-call casts rather than FSDP2 on one device: wrapping only to cast would add FSDP2's gather copies
and hooks to every pass of an unsharded model. The forward belongs to a class, not to each module: a
per-module forward is a distinct object that torch.compile guards on, so a compiled decoder layer would
recompile for every layer (and stop compiling at dynamo's recompile limit).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

COMPUTE_DTYPE_ATTR = "_verl_frozen_compute_dtype"


class _UpcastLinear(torch.autograd.Function):
    """`x @ W.T + b` with W cast to float32 for the product only; W is frozen (no gradient)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(weight)
        return F.linear(x, weight.float(), None if bias is None else bias.float())

    @staticmethod
    def backward(ctx, grad):
        (weight,) = ctx.saved_tensors
        return grad @ weight.float(), None, None


def _autocasting(tensor: torch.Tensor) -> bool:
    return torch.is_autocast_enabled(tensor.device.type)


def _linear_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if _autocasting(x):   # half-precision compute: autocast casts weights and inputs itself
        return F.linear(x, module.weight, module.bias)
    return _UpcastLinear.apply(x.float(), module.weight, module.bias)


def _embedding_forward(module: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    rows = F.embedding(ids, module.weight, module.padding_idx)
    return rows if _autocasting(module.weight) else rows.float()


class _HalfStoredLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear_forward(self, x)


class _HalfStoredEmbedding(nn.Embedding):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _embedding_forward(self, ids)


_HALF_STORED = {nn.Linear: _HalfStoredLinear, nn.Embedding: _HalfStoredEmbedding}


def upcast_frozen(model: nn.Module) -> int:
    """Make every frozen linear layer and embedding of `model` stored in half precision compute in
    float32 whenever autocast is off (see the module docstring; under autocast they run as autocast
    says, as any half-precision weight does); returns how many were changed. Records float32 as the
    model's compute dtype outside autocast, where the built-in engine and the numerics guard read it."""
    changed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, nn.Parameter) or weight.requires_grad or not weight.is_floating_point() \
                or weight.element_size() >= 4:
            continue
        half_stored = _HALF_STORED.get(type(module))
        if half_stored is None:
            continue
        module.__class__ = half_stored
        changed += 1
    if changed:
        setattr(model, COMPUTE_DTYPE_ATTR, torch.float32)
    return changed


def compute_dtype_of(model: nn.Module) -> torch.dtype:
    """The dtype `model` computes in without autocast: float32 where `upcast_frozen` changed it, else
    the dtype of its first parameter."""
    recorded = getattr(model, COMPUTE_DTYPE_ATTR, None)
    return recorded if recorded is not None else next(model.parameters()).dtype


def upcast_outside_autocast(model: nn.Module) -> bool:
    """True when `model`'s half-precision frozen weights compute in float32 outside autocast."""
    return getattr(model, COMPUTE_DTYPE_ATTR, None) == torch.float32


__all__ = ["compute_dtype_of", "upcast_frozen", "upcast_outside_autocast"]
