"""The profiler sections typed (upstream's `verl.utils.profiler.config`). `ProfilerConfig`'s keys are the packaged
YAML's. This verl's workers record no profiles (per-phase torch-profiler runs are benchmarks/profile_step.py): the
tool configs are here so upstream code that builds them imports, and `DistProfiler` refuses an enabled tool."""
from __future__ import annotations

from verl.base_config import BaseConfig
from verl.utils.config_sections import section_class

__all__ = ["NsightToolConfig", "TorchProfilerScheduleConfig", "TorchProfilerToolConfig", "TorchMemoryToolConfig",
           "PrecisionDebuggerToolConfig", "NPUToolConfig", "ProfilerConfig", "rollout_trace_dir"]

ProfilerConfig = section_class("ProfilerConfig", "actor_rollout_ref.actor.profiler", module=__name__,
                               doc="A role's `profiler` section: tool, enable, ranks, save_path.")
NsightToolConfig = section_class("NsightToolConfig", None, module=__name__, extra={"discrete": False},
                                 doc="Nsight Systems options.")
NPUToolConfig = section_class("NPUToolConfig", None, (NsightToolConfig,), module=__name__,
                              extra={"contents": [], "level": "level0", "analysis": True},
                              doc="Ascend profiler options.")
TorchProfilerScheduleConfig = section_class("TorchProfilerScheduleConfig", None, module=__name__,
                                            extra={"wait": 0, "warmup": 0, "active": 1, "repeat": 1},
                                            doc="torch.profiler schedule.")
TorchProfilerToolConfig = section_class("TorchProfilerToolConfig", None, module=__name__,
                                        extra={"contents": [], "discrete": False},
                                        doc="torch.profiler options.")
TorchMemoryToolConfig = section_class("TorchMemoryToolConfig", None, module=__name__,
                                      extra={"trace_alloc_max_entries": 100_000, "stack_depth": 32},
                                      doc="CUDA allocator history options.")
PrecisionDebuggerToolConfig = section_class("PrecisionDebuggerToolConfig", None, module=__name__,
                                            extra={"config_path": None, "data_dir": "outputs/precision_debug",
                                                   "steps": None, "stages": None, "strict": False},
                                            doc="msprobe precision debugger options.")


def rollout_trace_dir(profiler_config, rank: int) -> str:
    """Where a rank's rollout traces would go: <save_path>/rollout/rank_<rank>."""
    import os

    return os.path.join(profiler_config.save_path or "outputs/profile", "rollout", f"rank_{rank}")
