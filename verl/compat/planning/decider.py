"""The planner's notebook: every decision's reason, every adapted user setting, and the device's
capabilities as the rules ask for them."""
from __future__ import annotations

from typing import Any

from verl.compat.device.profile import DeviceProfile, SoftwareInfo

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
        sw = self.software
        if attn == "flash_attention_2":
            if self.profile.backend == "cuda" and self.cc < (8, 0):
                return f"FlashAttention-2 needs compute capability >= 8.0 ({cc_name(self.profile)})"
            if not sw.flash_attn_usable:
                return sw.notes.get("flash_attn", "flash_attn is not installed or not usable on this device "
                                                  "(needs compute capability >= 8.0)")
            if compute == "float32":
                return "flash_attention_2 runs only in float16/bfloat16"
        if attn == "torch_varlen":
            if not sw.torch_varlen_usable:
                return sw.notes.get("torch_varlen", "torch's varlen FlashAttention kernel is not usable here")
            if compute == "float32":
                return "torch_varlen runs only in float16/bfloat16"
        if attn == "xformers" and not sw.xformers_usable:
            return sw.notes.get("xformers", "xformers is not installed or its kernels do not load on this device")
        if attn not in ATTENTION_KERNELS:
            return f"unknown attention implementation (use one of {', '.join(ATTENTION_KERNELS)})"
        return None


# bitsandbytes' own support table (its README and installation guide): on NVIDIA GPUs its 4-bit (NF4)
# weights and 8-bit optimizers need compute capability 6.0+ from release 0.48 (5.0+ before: Maxwell
# wheels were dropped then); its CPU backend has 4-bit weights but no 8-bit optimizers; ROCm is listed
# as experimental, so compat does not plan it.
BNB_FEATURES = {"nf4": "4-bit (NF4) base weights", "adamw8bit": "8-bit AdamW states"}


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def bitsandbytes_missing(profile: DeviceProfile, version: str | None, feature: str) -> str | None:
    """Why bitsandbytes cannot give `feature` ("nf4" | "adamw8bit") on `profile` (None when it can)."""
    what = BNB_FEATURES[feature]
    if version is None:
        return f"{what} need bitsandbytes, which is not installed (pip install bitsandbytes)"
    if profile.backend == "rocm":
        return f"bitsandbytes lists its ROCm backend as experimental: compat does not plan its {what} there"
    if profile.backend == "cpu":
        if feature == "adamw8bit":
            return "bitsandbytes has no 8-bit optimizers on CPU (its support table)"
        return None
    floor = (5, 0) if version != "unknown" and _version_tuple(version) < (0, 48) else (6, 0)
    if (profile.compute_capability or (0, 0)) < floor:
        return (f"bitsandbytes {version} supports {what} from compute capability {floor[0]}.{floor[1]} "
                f"(this device has {cc_name(profile)})")
    return None


def cc_name(profile: DeviceProfile) -> str:
    if profile.backend == "cpu" or profile.compute_capability is None:
        return profile.backend
    return f"sm_{profile.compute_capability[0]}{profile.compute_capability[1]}"
