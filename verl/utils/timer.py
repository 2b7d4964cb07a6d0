"""Wall-clock sections of a training step, recorded under upstream's `timing_s/<name>` keys."""
from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def marked_timer(name: str, timing_raw: dict[str, float], **_ignored):
    """Add the seconds spent inside the block to `timing_raw[name]`.

    Extra keyword arguments (upstream passes `color=` for profiler ranges) are accepted and ignored.
    Times accumulate, so a section entered twice in one step reports its total.
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start
