"""MFU helpers under upstream's path (`verl.utils.flops_counter`): achieved TFLOP/s of a pass over some
sequences (this verl's dense-transformer count, `verl.utils.flops`) and the device's peak from its compat
profile, never from a table keyed by the device's marketing name."""
from __future__ import annotations

__all__ = ["get_device_flops", "FlopsCounter"]

_UNITS = {"B": 1e9, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def get_device_flops(unit: str = "T", device_name: str | None = None) -> float:
    """The device's dense peak in `unit` FLOP/s: its fastest half-precision rate where it has one, else fp32.
    `device_name` names a catalog device (e.g. "h100-80gb"); by default the detected device. inf where the
    profile has no figure (a CPU), so MFU reads 0 as upstream's does for an unknown device."""
    from verl.compat.device.catalog import get_profile
    from verl.compat.device.detect import detect_profile

    if unit not in _UNITS:
        raise ValueError(f"unit must be one of {sorted(_UNITS)}, got {unit!r}")
    profile = get_profile(device_name) if device_name else detect_profile()
    peak = max(profile.bf16_tflops or 0.0, profile.fp16_tflops or 0.0) or (profile.fp32_tflops or 0.0)
    return peak * 1e12 / _UNITS[unit] if peak > 0 else float("inf")


class FlopsCounter:
    """`estimate_flops(batch_seqlens, delta_time)` -> (achieved TFLOP/s, the device's peak TFLOP/s)."""

    def __init__(self, config):
        self.config = config

    def estimate_flops(self, batch_seqlens, delta_time: float, **kwargs) -> tuple[float, float]:
        from verl.utils.flops import training_flops

        achieved = training_flops(self.config, list(batch_seqlens)) / max(delta_time, 1e-12) / 1e12
        return achieved, get_device_flops()
