"""Seconds this process has spent inside torch.compile: dynamo's tracing, AOTAutograd and code generation.

On a fresh machine most of a compiled run's first step is compiling, not computing (docs/performance.md,
"Compile off the critical path"); the workers report it per pass as `perf/compile_s/<pass>` so that a run's
log says how much of its first steps went there. The clock counts wall time from the start of an outermost
compile to its end (dynamo's start and end callbacks, which fire once for nested or concurrent compiles),
whichever thread compiles: with `compat.compile_warmup=background` that is time overlapped with eager work,
with `synchronous` it is time the pass waited.
"""
from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_total = 0.0
_started: float | None = None


def _start(*_args) -> None:
    global _started
    with _lock:
        _started = time.monotonic()


def _end(*_args) -> None:
    global _started, _total
    with _lock:
        if _started is not None:
            _total += time.monotonic() - _started
            _started = None


def install() -> bool:
    """Register the clock with dynamo (again after `torch._dynamo.reset()`, which drops every callback);
    False where this torch has no compile callbacks. Cheap enough to call at every pass."""
    try:
        from torch._dynamo.callback import callback_handler

        with _lock:
            if _start not in callback_handler.start_callbacks:
                callback_handler.register_start_callback(_start)
            if _end not in callback_handler.end_callbacks:
                callback_handler.register_end_callback(_end)
    except (ImportError, AttributeError):   # a torch without (these) compile callbacks: nothing is counted
        return False
    return True


def seconds() -> float:
    """Compile seconds counted so far (a compile under way counts up to now); only compiles after `install`."""
    with _lock:
        return _total + (time.monotonic() - _started if _started is not None else 0.0)
