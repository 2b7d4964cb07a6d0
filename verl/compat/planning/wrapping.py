"""Whether a role's model is wrapped in FSDP2. Pure, like the planner.

Across several devices FSDP2 is what shards weights, gradients and optimizer state. On one device it
shards nothing, and its all-gather is a full copy of the weights: a second model during generation
(the actor gathered whole), during forwards that gather once per call, and per unit in an update,
plus a copy of each unit's gradients to reduce from. It earns that copy on one device only where it
does something else with it: casting the weights to the compute dtype as it gathers them (the copy
compute needs anyway), or keeping them in host memory between uses (param offload). Elsewhere the
model runs unwrapped, and every pass reads the stored weights in place. A LoRA model on one device
runs unwrapped too: its frozen base is stored as compute reads it, and only the small adapters train.
"""
from __future__ import annotations

from verl.compat.plan import RolePlan


def wraps_in_fsdp(plan: RolePlan, ranks: int, always: bool = False) -> tuple[bool, str]:
    """(wrapped, reason) for a role with this plan at `ranks` data-parallel processes; `always` is the
    user's compat.always_fsdp (wrap on one device too, as upstream does)."""
    if ranks > 1:
        return True, f"{ranks} ranks: FSDP2 shards weights, gradients and optimizer state across them"
    if plan.optimizer_8bit and not plan.param_offload:
        return False, "8-bit AdamW (bitsandbytes) steps plain tensors, not FSDP2's sharded ones: the role runs unwrapped"
    if always:
        return True, "compat.always_fsdp=true: wrapped on one device too (its gather copies the weights)"
    if plan.param_offload:
        return True, "FSDP2's offload policy keeps the weights in host memory and gathers them onto the device"
    if plan.lora_rank:
        return False, ("LoRA on one device: the frozen base is read where it is stored (in "
                       f"{plan.frozen_dtype or plan.param_dtype}{', 4-bit' if plan.base_quantization else ''}) and "
                       "the adapters are small, so FSDP2 would only copy the base for every pass")
    if plan.cast_on_gather and plan.compute_dtype != plan.param_dtype:
        return True, (f"FSDP2 casts the {plan.param_dtype} weights to {plan.compute_dtype} as it gathers them "
                      f"(a copy compute needs anyway)")
    return False, (f"one device, weights computed with as stored ({plan.param_dtype}): FSDP2 would shard "
                   f"nothing and copy them for every pass, so the model runs unwrapped")
