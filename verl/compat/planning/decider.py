"""The planner's notebook: every decision's reason, every adapted user setting, and the device's
capabilities as the rules ask for them."""
from __future__ import annotations

from typing import Any

from verl.compat.device.profile import DeviceProfile, SoftwareInfo, cc_name
from verl.compat.device.support import bitsandbytes_missing

ATTENTION_KERNELS = ("eager", "sdpa", "xformers", "torch_varlen", "flash_attention_2")
# attention that runs packed micro-batches (use_remove_padding) without a dense mask
PACKED_KERNELS = ("flash_attention_2", "torch_varlen")


class PlanError(RuntimeError):
    """The run cannot be planned on this device (strict-mode refusal or memory shortfall)."""


class MemoryShortfall(PlanError):
    """No rung of the memory ladder fits: the message gives the shortfall and what would fit."""


class Decider:
    """Collects reasons and warnings while deciding; `adapt` handles settings the device lacks."""

    def __init__(self, profile: DeviceProfile, software: SoftwareInfo, strict: bool):
        self.profile, self.software, self.strict = profile, software, strict
        self.reasons: dict[str, str] = {}
        self.warnings: list[str] = []

    def note(self, key: str, value: Any, reason: str) -> Any:
        self.reasons[key] = reason
        return value

    def adapt(self, key: str, setting: str, asked: Any, replacement: Any, why: str) -> Any:
        msg = f"{setting}={asked} is not possible on {self.profile.name}: {why}; using {replacement} instead."
        if self.strict:
            raise PlanError(msg + " (compat.strict=true: change the setting or set compat.strict=false)")
        if msg not in self.warnings:   # one setting adapted for several roles (a shared model key) is named once
            self.warnings.append(msg)
        self.reasons[key] = f"adapted from {asked}: {why}"
        return replacement

    # -- capabilities
    def bnb_missing(self, feature: str) -> str | None:
        """Why bitsandbytes' `feature` ("nf4" | "adamw8bit") is not usable here (None when it is)."""
        return bitsandbytes_missing(self.profile, self.software.bitsandbytes_version, feature)

    @property
    def cc(self) -> tuple[int, int]:
        return self.profile.compute_capability or (0, 0)

    def dtype_missing(self, dtype: str) -> str | None:
        """Why the device cannot compute in `dtype` (None when it can)."""
        p = self.profile
        if dtype == "float32":
            return None
        if p.backend == "cpu":
            return "the CPU backend trains in float32 only (half-precision matmuls are emulated there)"
        if dtype == "bfloat16" and not p.native_bf16:
            return f"bfloat16 needs compute capability >= 8.0 (this device has {cc_name(p)})"
        if dtype == "float16" and not p.tensor_core_fp16:
            return (f"float16 needs tensor cores (compute capability >= 7.0; this device has {cc_name(p)}, "
                    f"where half precision runs at a fraction of float32 speed)")
        return None

    def default_dtype(self) -> tuple[str, str]:
        p = self.profile
        if p.backend == "cpu":
            return "float32", "CPU: float32 (no fast half-precision matmul)"
        if p.native_bf16:
            return "bfloat16", f"{cc_name(p)} has native bfloat16: bfloat16 compute, float32 master weights"
        if p.tensor_core_fp16:
            return "float16", f"{cc_name(p)} has float16 tensor cores but no bfloat16: float16 with a grad scaler"
        return "float32", f"{cc_name(p)} has neither bfloat16 nor fast float16: float32"

    def attn_missing(self, attn: str, compute: str) -> str | None:
        software = self.software
        if attn == "flash_attention_2":
            if self.profile.backend == "cuda" and self.cc < (8, 0):
                return f"FlashAttention-2 needs compute capability >= 8.0 ({cc_name(self.profile)})"
            if not software.flash_attn_usable:
                return software.notes.get("flash_attn", "flash_attn is not installed or not usable on this device "
                                                  "(needs compute capability >= 8.0)")
            if compute == "float32":
                return "flash_attention_2 runs only in float16/bfloat16"
        if attn == "torch_varlen":
            if not software.torch_varlen_usable:
                return software.notes.get("torch_varlen", "torch's varlen FlashAttention kernel is not usable here")
            if compute == "float32":
                return "torch_varlen runs only in float16/bfloat16"
        if attn == "xformers" and not software.xformers_usable:
            return software.notes.get("xformers", "xformers is not installed or its kernels do not load on this device")
        if attn not in ATTENTION_KERNELS:
            return f"unknown attention implementation (use one of {', '.join(ATTENTION_KERNELS)})"
        return None
