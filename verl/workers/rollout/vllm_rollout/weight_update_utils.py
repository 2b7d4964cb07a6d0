"""Upstream's `verl.workers.rollout.vllm_rollout.weight_update_utils`: pushed weights split into parameters and
buffers (a model's `load_weights` knows only parameters), and buffers copied into the live model in place."""
from __future__ import annotations

import torch

__all__ = ["apply_buffer_updates", "split_buffer_updates"]


def split_buffer_updates(model: torch.nn.Module, weights):
    """(parameter updates, buffer updates, the model's named buffers) from `(name, tensor)` pairs, in order."""
    buffers = dict(model.named_buffers())
    params, buffer_updates = [], []
    for name, tensor in weights:
        (buffer_updates if name in buffers else params).append((name, tensor))
    return params, buffer_updates, buffers


@torch.no_grad()
def apply_buffer_updates(model: torch.nn.Module, buffer_updates, named_buffers: dict | None = None) -> int:
    """Copy each `(name, tensor)` into the model's buffer of that name (cast to its dtype and device); names the
    model lacks are passed over, a shape mismatch is an error. Returns how many buffers were written."""
    buffers = dict(model.named_buffers()) if named_buffers is None else named_buffers
    written = 0
    for name, tensor in buffer_updates or ():
        target = buffers.get(name)
        if target is None:
            continue
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(f"buffer {name}: the model's has shape {tuple(target.shape)}, the update "
                             f"{tuple(tensor.shape)}")
        target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        written += 1
    return written
