"""`DistProfiler` under upstream's path. This verl records no profiles from the workers: with no tool configured
(the default) the profiler does nothing; asking for a tool raises NotImplementedError."""
from __future__ import annotations

from verl.utils.profiler.config import ProfilerConfig
from verl.utils.profiler.empty_annotations import mark_annotate, mark_end_range, mark_start_range

__all__ = ["DistProfiler", "DistProfilerExtension", "ProfilerConfig", "build_rollout_dist_profiler",
           "mark_start_range", "mark_end_range", "mark_annotate"]


class DistProfiler:
    """A rank's profiler; here a no-op unless a tool is asked for, which is refused."""

    def __init__(self, rank: int, config=None, tool_config=None, **kwargs):
        tool = getattr(config, "tool", None) if config is not None else None
        enabled = bool(getattr(config, "enable", False)) if config is not None else False
        if tool and enabled:
            raise NotImplementedError(f"profiler tool {tool!r}: worker profiling is not supported by this verl; use "
                                      "benchmarks/profile_step.py (torch profiler per phase)")
        self.rank, self.config = rank, config

    def check_enable(self) -> bool:
        return False

    def start(self, **kwargs) -> None:
        return None

    def stop(self) -> None:
        return None

    @staticmethod
    def annotate(message=None, color=None, domain=None, category=None, **kwargs):
        return lambda func: func


class DistProfilerExtension:
    """Mixin giving a worker `start_profile` / `stop_profile` around its `DistProfiler`."""

    def __init__(self, profiler: DistProfiler):
        self.profiler = profiler

    def start_profile(self, **kwargs) -> None:
        self.profiler.start(**kwargs)

    def stop_profile(self) -> None:
        self.profiler.stop()


def build_rollout_dist_profiler(rank: int, config=None, tool_config=None, **kwargs) -> DistProfiler:
    return DistProfiler(rank, config, tool_config)
