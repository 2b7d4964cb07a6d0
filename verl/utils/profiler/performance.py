"""Timers and memory logging under upstream's `verl.utils.profiler.performance`."""
from __future__ import annotations

import functools
import logging
from contextlib import contextmanager

from verl.utils.timer import marked_timer

__all__ = ["simple_timer", "marked_timer", "log_gpu_memory_usage", "GPUMemoryLogger", "reduce_timing",
           "gather_timing"]


@contextmanager
def simple_timer(name: str, timing_raw: dict):
    """Add the block's wall time in seconds to `timing_raw[name]`."""
    with marked_timer(name, timing_raw):
        yield


def log_gpu_memory_usage(head: str, logger: logging.Logger = None, level=logging.DEBUG, rank: int = 0) -> None:
    """Log allocated / reserved device memory (GiB) with a heading."""
    from verl.utils.memory_utils import get_memory_info

    info = get_memory_info()
    message = (f"{head}, memory allocated (GB): {info['allocated_memory_gb']:.2f}, "
               f"memory reserved (GB): {info['reserved_memory_gb']:.2f}")
    (logger or logging.getLogger(__name__)).log(level, message)


class GPUMemoryLogger:
    """Decorator: log device memory before and after each call of the method."""

    def __init__(self, role: str, logger: logging.Logger = None, level=logging.DEBUG, log_only_rank_0: bool = True):
        self.role, self.logger, self.level = role, logger, level

    def __call__(self, func):
        @functools.wraps(func)
        def run(*args, **kwargs):
            log_gpu_memory_usage(f"Before {self.role} {func.__name__}", self.logger, self.level)
            result = func(*args, **kwargs)
            log_gpu_memory_usage(f"After {self.role} {func.__name__}", self.logger, self.level)
            return result

        return run


def gather_timing(timing_raw: dict[str, float]) -> dict[str, list[float]]:
    """Every rank's value of each timing (one rank: its own, as one-element lists)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return {k: [v] for k, v in timing_raw.items()}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, timing_raw)
    return {k: [g[k] for g in gathered] for k in timing_raw}


def reduce_timing(timing_raw: dict[str, float], reduce_op: str = "max") -> dict[str, float]:
    """Each timing reduced over ranks ("max", "min" or "mean")."""
    ops = {"max": max, "min": min, "mean": lambda v: sum(v) / len(v)}
    if reduce_op not in ops:
        raise ValueError(f"reduce_op must be one of {sorted(ops)}")
    return {k: ops[reduce_op](v) for k, v in gather_timing(timing_raw).items()}
