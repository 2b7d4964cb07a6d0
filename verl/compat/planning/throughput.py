"""Throughput rules of the plan: how training passes are batched and which optimizer kernel runs.

Small and self-contained so the planner only calls them. Neither rule changes the math: losses are
normalised by the global mini-batch (so any micro-batching gives the same gradient), and the fused
AdamW kernel computes the same update as the per-tensor one.
"""
from __future__ import annotations

from typing import Any

from verl.compat.device.profile import DeviceProfile
from verl.compat.planning.settings import raw

_KEY = "actor_rollout_ref.actor.use_dynamic_bsz"


# Upstream's token budgets (`*_max_token_len_per_gpu`), where `auto` budgets start.
UPSTREAM_TOKEN_BUDGET = {"actor": 16384, "actor_forward": 16384, "ref": 16384, "critic": 32768, "critic_forward": 32768}


def decide_dynamic_bsz(note, profile: DeviceProfile, config: Any) -> bool:
    """use_dynamic_bsz: the user's true/false; `auto` turns token budgets on where a device runs the passes.

    On an accelerator a small fixed micro-batch (the quick-start's 4 x 1024 tokens of a 0.5B model)
    leaves the device waiting on kernel launches; token-budgeted micro-batches are fewer and fuller,
    and (padded forwards) count padded size, so the memory model bounds them like fixed ones.
    `note(key, value, reason)` records the reason.
    """
    asked = raw(config, _KEY)
    if isinstance(asked, str) and asked.strip().lower() == "auto":
        if profile.backend == "cpu":
            return note("actor.use_dynamic_bsz", False, "CPU: fixed micro-batches (no kernel-launch overhead to "
                                                        "amortise)")
        return note("actor.use_dynamic_bsz", True,
                    "token-budgeted micro-batches: fewer, fuller passes than small fixed ones (launch overhead "
                    "dominates those); budgets are at least the configured micro-batch x sequence length")
    value = bool(asked) if not isinstance(asked, str) else asked.strip().lower() in ("1", "true", "yes", "on")
    return note("actor.use_dynamic_bsz", value, "set by the user" if asked is not None else "upstream default")


def dynamic_auto(config: Any) -> bool:
    """Whether the planner (not the user) chose use_dynamic_bsz."""
    asked = raw(config, _KEY)
    return isinstance(asked, str) and asked.strip().lower() == "auto"


# torch's AdamW has a fused CPU kernel from this release on (before, `fused=True` was CUDA-only)
FUSED_CPU_ADAMW_TORCH = (2, 4)


def decide_fused_optimizer(note, profile: DeviceProfile, name: str, param_offload: bool, torch_version: str = "",
                           eight_bit: bool = False) -> bool:
    """AdamW as one fused kernel per step: on an accelerator holding the parameters, and for the host-side
    step of an offloaded model where the installed torch has the fused CPU kernel (else its foreach form,
    a few vectorised passes over all tensors instead of one loop per tensor)."""
    key = f"{name}.fused_optimizer"
    if eight_bit:
        return note(key, False, "bitsandbytes' AdamW8bit has its own kernels (torch's fused flag does not apply)")
    if profile.backend == "cpu":
        return note(key, False, "CPU: torch's default AdamW implementation")
    if param_offload:
        if _release(torch_version) >= FUSED_CPU_ADAMW_TORCH:
            return note(key, True, f"parameters live in host memory (param offload): torch {torch_version}'s fused "
                                   "CPU AdamW steps them, one vectorised kernel over every tensor, on all host cores")
        return note(key, False, f"parameters live in host memory (param offload) and torch {torch_version or '?'} "
                                "has no fused CPU AdamW (torch >= 2.4): the foreach implementation steps them")
    return note(key, True, "fused AdamW: one kernel launch per step for all parameters instead of several per tensor")


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string ("2.11.0+cu128" -> (2, 11)); (0, 0) when unreadable."""
    try:
        major, minor = version.split("+")[0].split(".")[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
    except ValueError:
        return 0, 0


def peak_flops(profile: DeviceProfile, compute_dtype: str) -> float:
    """The profile's dense peak for a compute dtype, in FLOP/s (0 when the profile has none, as on CPU);
    the denominator of upstream's perf/mfu/* metrics."""
    tflops = {"bfloat16": profile.bf16_tflops, "float16": profile.fp16_tflops}.get(compute_dtype, profile.fp32_tflops)
    return float(tflops or 0.0) * 1e12
