"""Where a run's start-up goes: wall time from launching the process to its first training step.

The driver marks the end of each stage as it passes it (`startup_clock().mark("datasets")`), so the
stages are consecutive and add up to the total, measured from the process's own start time (the
interpreter and the first imports count too). Work done on another thread while a stage runs is
recorded beside it (`record(..., overlapped=True)`) and not added again; the workers report their own
pieces of model set-up (`detail`), which lie inside the driver's `init_models` stage.

The trainer prints the table once, just before the first step, and logs `timing_s/startup` (the total)
and `timing_s/startup/<stage>` with the first step's metrics.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

METRIC = "timing_s/startup"


def process_start_time() -> float:
    """The epoch time this process was started, from the kernel's record (Linux: /proc, to 10 ms);
    elsewhere, or if /proc cannot be read, the time of this call."""
    now = time.time()
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # field 22 (starttime, clock ticks after boot) follows the ")" that ends the command name
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            since_boot = float(uptime.read().split()[0])
        return now - max(0.0, since_boot - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return now


@dataclass
class StartupClock:
    """Consecutive stages since `origin` (epoch seconds), plus overlapped and worker-side pieces."""

    origin: float = field(default_factory=process_start_time)
    stages: list[tuple[str, float]] = field(default_factory=list)
    overlapped: list[tuple[str, float]] = field(default_factory=list)
    details: list[tuple[str, float]] = field(default_factory=list)

    def __post_init__(self):
        self._last = self.origin

    def mark(self, stage: str) -> float:
        """Close `stage`: it ran from the previous mark until now. Returns its seconds."""
        now = time.time()
        seconds = max(0.0, now - self._last)
        self.stages.append((stage, seconds))
        self._last = now
        return seconds

    def record(self, stage: str, seconds: float) -> None:
        """Work that ran on another thread during the marked stages (shown, not added to the total)."""
        self.overlapped.append((stage, seconds))

    def detail(self, stage: str, seconds: float) -> None:
        """A piece of a marked stage measured elsewhere (a worker's model load inside `init_models`)."""
        self.details.append((stage, seconds))

    @property
    def total(self) -> float:
        return sum(seconds for _, seconds in self.stages)

    def metrics(self) -> dict[str, float]:
        """`timing_s/startup` and one `timing_s/startup/<stage>` per stage (repeated stages summed)."""
        out: dict[str, float] = {METRIC: self.total}
        for stage, seconds in (*self.stages, *self.overlapped, *self.details):
            key = f"{METRIC}/{stage}"
            out[key] = out.get(key, 0.0) + seconds
        return out

    def table(self) -> str:
        """The breakdown, one stage a line, for the log."""
        width = max((len(name) for name, _ in (*self.stages, *self.overlapped, *self.details)), default=5) + 2
        lines = [f"verl start-up: {self.total:.1f} s from process start to the first step"]
        lines += [f"  {name:<{width}}{seconds:7.2f} s" for name, seconds in self.stages]
        lines += [f"  {name:<{width}}{seconds:7.2f} s  (inside init_models)" for name, seconds in self.details]
        lines += [f"  {name:<{width}}{seconds:7.2f} s  (on a thread, overlapped with the stages above)"
                  for name, seconds in self.overlapped]
        return "\n".join(lines)


_CLOCK: StartupClock | None = None
_ENDED = False


def startup_clock() -> StartupClock:
    """This process's clock, made on first use. The first run in a process counts from the process's
    start; a later run in the same process (after `end_startup`) from its first use of the clock."""
    global _CLOCK
    if _CLOCK is None:
        _CLOCK = StartupClock(origin=time.time()) if _ENDED else StartupClock()
    return _CLOCK


def end_startup() -> None:
    """The first step has begun: the next run in this process gets a clock of its own."""
    global _CLOCK, _ENDED
    _CLOCK, _ENDED = None, True


class Laps:
    """Consecutive pieces of one piece of work (a worker's set-up): `laps("load")` closes the piece that
    began at the previous lap (or `restart()`). `seconds` is what a worker returns for the driver's table.

    `from_process_start` records first how long this process ran before (interpreter, imports, Ray's
    worker start-up) as "process_start"."""

    def __init__(self, from_process_start: bool = False):
        self.seconds: dict[str, float] = {}
        if from_process_start:
            self.seconds["process_start"] = max(0.0, time.time() - process_start_time())
        self._last = time.perf_counter()

    def restart(self) -> None:
        """The next lap starts now (the time since the last lap was spent waiting, not working)."""
        self._last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now
