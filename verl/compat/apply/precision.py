"""Re-issuing the plan when the float16 numerics guard fails at run time.

The planner decides, per role, whether the guard runs and which dtype the role falls back to
(`RolePlan.numerics_guard`, `guard_fallback_dtype`). What follows from a failed check is a plan
decision too, so it lives here and the workers only apply the updated plan:

- the failed role computes in its fallback dtype, without a grad scaler and without the guard;
- a frozen reference follows a failed actor (it starts from the same weights, so it overflows too);
- the rollout, which generates with the actor's weights, follows the actor when it ran in the
  dtype that failed.

`guard_fallback` is pure: the worker and the trainer each call it with the same inputs and get
the same plan, and its `PlanChange`s are what both log ("plan updated: ...").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from verl.compat.plan import Plan, RolePlan


@dataclass(frozen=True)
class PlanChange:
    """One plan field changed at run time: `key` as in `plan.reasons` ("actor.compute_dtype")."""

    key: str
    old: object
    new: object


def _fall_back(role: RolePlan) -> RolePlan:
    dtype = role.guard_fallback_dtype or "float32"
    return dataclasses.replace(role, compute_dtype=dtype, grad_scaler=False, numerics_guard=False,
                               guard_fallback_dtype=None,
                               cast_on_gather=role.cast_on_gather and dtype != role.param_dtype)


def _diff(prefix: str, old, new) -> list[PlanChange]:
    return [PlanChange(f"{prefix}.{f.name}", getattr(old, f.name), getattr(new, f.name))
            for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)]


def guard_fallback(plan: Plan, role: str, reason: str) -> tuple[Plan, list[PlanChange]]:
    """The plan after `role`'s numerics guard failed with `reason`, and what changed.

    A role without a pending guard is returned unchanged (no changes): calling this twice, or for
    a role the planner did not guard, is harmless.
    """
    current: RolePlan | None = getattr(plan, role)
    if current is None or not current.numerics_guard:
        return plan, []
    failed = current.compute_dtype
    roles = {role: _fall_back(current)}
    if role == "actor" and plan.ref is not None and plan.ref.numerics_guard and plan.ref.compute_dtype == failed:
        roles["ref"] = _fall_back(plan.ref)
    rollout = plan.rollout
    if role == "actor" and rollout.dtype == failed:
        rollout = dataclasses.replace(rollout, dtype=roles["actor"].compute_dtype)
    changes = [c for name, new in roles.items() for c in _diff(name, getattr(plan, name), new)]
    changes += _diff("rollout", plan.rollout, rollout)
    reasons = dict(plan.reasons)
    why = f"numerics guard: {reason}"
    for change in changes:
        reasons[change.key] = why
    updated = dataclasses.replace(plan, rollout=rollout, reasons=reasons, **roles)
    return updated, changes


def describe(changes: list[PlanChange], reason: str) -> str:
    """The log line for a re-issued plan: "plan updated: actor.compute_dtype float16 -> float32, ... (why)"."""
    shown = ", ".join(f"{c.key} {c.old} -> {c.new}" for c in changes)
    return f"plan updated: {shown} (numerics guard: {reason})"
