"""Profiling hooks under upstream's path (`verl.utils.profiler`): timers, memory logging, range marks and a
`DistProfiler` that records nothing here (see profile.py)."""
from verl.utils.profiler.config import ProfilerConfig
from verl.utils.profiler.empty_annotations import mark_annotate, mark_end_range, mark_start_range
from verl.utils.profiler.performance import GPUMemoryLogger, log_gpu_memory_usage, marked_timer, simple_timer
from verl.utils.profiler.profile import DistProfiler, DistProfilerExtension, build_rollout_dist_profiler

__all__ = ["GPUMemoryLogger", "log_gpu_memory_usage", "mark_start_range", "mark_end_range", "mark_annotate",
           "DistProfiler", "DistProfilerExtension", "ProfilerConfig", "build_rollout_dist_profiler", "simple_timer",
           "marked_timer"]
