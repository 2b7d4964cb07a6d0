"""The rollout section (`actor_rollout_ref.rollout`) typed, with its sampling, multi-turn and agent subsections."""
from __future__ import annotations

from verl.base_config import BaseConfig
from verl.utils.config_sections import section_class, unsupported_class

__all__ = ["SamplingConfig", "MultiTurnConfig", "CustomAsyncServerConfig", "AgentLoopConfig", "TraceConfig",
           "ServerConfig", "PrometheusConfig", "RolloutConfig", "CheckpointEngineConfig"]

_R = "actor_rollout_ref.rollout"
SamplingConfig = section_class("SamplingConfig", f"{_R}.val_kwargs", module=__name__,
                               doc="Sampling parameters (`rollout.val_kwargs` for validation).")
MultiTurnConfig = section_class("MultiTurnConfig", f"{_R}.multi_turn", mutable=("max_assistant_turns", "max_user_turns"),
                                module=__name__, doc="`rollout.multi_turn`: tool-calling conversation limits.")
CustomAsyncServerConfig = section_class("CustomAsyncServerConfig", None, extra={"path": None, "name": None},
                                        module=__name__, doc="A user async server class: file `path`, class `name`.")
AgentLoopConfig = section_class("AgentLoopConfig", f"{_R}.agent", nested={"custom_async_server": CustomAsyncServerConfig},
                                extra={"custom_async_server": None, "agent_loop_manager_class": None},
                                module=__name__, doc="`rollout.agent`: agent-loop workers and the default loop.")
TraceConfig = section_class("TraceConfig", None, module=__name__, doc="Rollout tracing backend and sample limits.",
                            extra={"project_name": None, "experiment_name": None, "backend": None, "token2text": False,
                                   "max_samples_per_step_per_worker": None})
ServerConfig = section_class("ServerConfig", None, module=__name__, doc="HTTP rollout-server timeouts and retries.",
                             extra={"timeout": 60.0, "max_attempts": 3, "retry_delay": 2.0, "max_connections": 1000,
                                    "max_start_wait_time": 300.0})
PrometheusConfig = unsupported_class("PrometheusConfig", BaseConfig, "Prometheus metrics of rollout servers",
                                     __name__)
CheckpointEngineConfig = section_class(
    "CheckpointEngineConfig", None, module=__name__, mutable=("backend",),
    extra={"backend": "naive", "update_weights_bucket_megabytes": 2048, "engine_kwargs": {},
           "custom_backend_module": None},
    doc="How weights reach the rollout engine (this verl pushes them in memory: `naive`).")
RolloutConfig = section_class("RolloutConfig", _R,
                              nested={"val_kwargs": SamplingConfig, "multi_turn": MultiTurnConfig,
                                      "agent": AgentLoopConfig},
                              module=__name__, doc="`actor_rollout_ref.rollout`: engine, sampling, lengths, memory.")
