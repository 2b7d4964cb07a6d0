"""The device type and collective backend names this process uses, for code that asks by function
(upstream's `verl.utils.device`) instead of receiving a plan.

In a worker the answer is the applied plan's; elsewhere (the driver, a user's script) it is what the
planner would decide for the detected device, by the same rule.
"""
from __future__ import annotations

from verl.compat.apply.apply_plan import applied_plan


def names_for_backend(backend: str) -> tuple[str, str]:
    """(torch device type, collective backend) for a profile backend ("cuda" | "rocm" | "cpu")."""
    return ("cpu", "gloo") if backend == "cpu" else ("cuda", "cpu:gloo,cuda:nccl")   # the planner's rule


def current_names() -> tuple[str, str]:
    plan = applied_plan()
    if plan is not None:
        return plan.device_type, plan.dist_backend
    from verl.compat.device.detect import detect_profile

    return names_for_backend(detect_profile().backend)
