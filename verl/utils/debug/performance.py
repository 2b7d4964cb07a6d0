"""Timers upstream code imports from `verl.utils.debug.performance`."""
from contextlib import contextmanager

from verl.utils.timer import marked_timer

__all__ = ["simple_timer", "marked_timer"]


@contextmanager
def simple_timer(name: str, timing_raw: dict):
    """Add the block's wall time in seconds to `timing_raw[name]` (the trainer's `marked_timer` without marks)."""
    with marked_timer(name, timing_raw):
        yield
