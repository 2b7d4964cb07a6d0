"""Accelerator memory helpers (upstream's `verl.utils.memory_utils`), on the device verl.compat chose."""
from __future__ import annotations

import gc
import logging

__all__ = ["aggressive_empty_cache", "reset_memory_stats", "get_memory_info", "log_memory_usage",
           "optimize_memory_for_inference", "optimize_memory_for_training", "enable_memory_visualize",
           "clear_memory_history", "MemorySnapshotSampler"]

logger = logging.getLogger(__name__)


def _device():
    from verl.utils.device import get_torch_device, is_cuda_available, is_npu_available

    return get_torch_device() if (is_cuda_available or is_npu_available) else None


def aggressive_empty_cache(force_sync: bool = True, max_retries: int = 3) -> None:
    """Collect garbage and return cached blocks to the device, up to `max_retries` rounds while that frees more."""
    device = _device()
    for _ in range(max(1, max_retries)):
        before = device.memory_reserved() if device is not None else 0
        gc.collect()
        if device is None:
            return
        device.empty_cache()
        if force_sync:
            device.synchronize()
        if device.memory_reserved() >= before:
            return


def reset_memory_stats() -> None:
    device = _device()
    if device is not None:
        device.reset_peak_memory_stats()


def get_memory_info() -> dict:
    """Allocated / reserved / peak / total memory in GiB (zeros on a CPU host)."""
    device = _device()
    if device is None:
        return {"total_memory_gb": 0.0, "reserved_memory_gb": 0.0, "allocated_memory_gb": 0.0,
                "cached_memory_gb": 0.0, "max_memory_allocated_gb": 0.0, "max_memory_reserved_gb": 0.0}
    gib = 1024 ** 3
    index = device.current_device()
    total = device.get_device_properties(index).total_memory
    return {"total_memory_gb": total / gib, "reserved_memory_gb": device.memory_reserved() / gib,
            "allocated_memory_gb": device.memory_allocated() / gib,
            "cached_memory_gb": (device.memory_reserved() - device.memory_allocated()) / gib,
            "max_memory_allocated_gb": device.max_memory_allocated() / gib,
            "max_memory_reserved_gb": device.max_memory_reserved() / gib}


def log_memory_usage(stage: str = "current") -> None:
    info = get_memory_info()
    logger.info("memory at %s: allocated %.2f GiB, reserved %.2f GiB, peak %.2f GiB", stage,
                info["allocated_memory_gb"], info["reserved_memory_gb"], info["max_memory_allocated_gb"])


def optimize_memory_for_inference() -> None:
    """Free cached memory before generation."""
    aggressive_empty_cache(force_sync=True)


def optimize_memory_for_training() -> None:
    """Free cached memory before an update."""
    aggressive_empty_cache(force_sync=False)


def enable_memory_visualize(trace_alloc_max_entries: int = 200_000, stack_depth: int = 32, context: str = "all",
                            stacks: str = "all", devices=None, record_context: bool = True):
    """Start recording the CUDA allocator's history (for torch.cuda.memory._dump_snapshot)."""
    import torch

    if not torch.cuda.is_available():
        logger.warning("enable_memory_visualize: no CUDA device, nothing recorded")
        return
    torch.cuda.memory._record_memory_history(max_entries=trace_alloc_max_entries, context=context, stacks=stacks)


def clear_memory_history(trace_alloc_max_entries: int = 200_000, stack_depth: int = 32):
    """Stop recording the allocator history."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(enabled=None)


class MemorySnapshotSampler:
    """Upstream's periodic allocator snapshots; not supported here (use benchmarks/memory_model.py)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("MemorySnapshotSampler (periodic allocator snapshots) is not supported by this verl; "
                                  "see docs/upstream/compatibility.md")
