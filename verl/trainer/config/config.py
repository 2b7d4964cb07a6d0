"""Upstream's shared config sections (`CheckpointConfig`, `ProfileConfig`, `HybridRolloutSwitchConfig`,
`BaseModelConfig`, `ModuleConfig`), their keys and defaults taken from the packaged YAML where it has them."""
from __future__ import annotations

from verl.utils.config_sections import section_class

__all__ = ["CheckpointConfig", "ProfileConfig", "HybridRolloutSwitchConfig", "BaseModelConfig"]

_M = __name__

CheckpointConfig = section_class(
    "CheckpointConfig", "actor_rollout_ref.actor.checkpoint", extra={"save_lora_only": False}, module=_M,
    doc="What a checkpoint saves and loads (`save_contents`, `load_contents`) and how.")
ProfileConfig = section_class(
    "ProfileConfig", None, module=_M, doc="Which ranks and steps a profiler records, and where.",
    extra={"profile_ranks": None, "step_start": -1, "step_end": -1, "save_path": None})
HybridRolloutSwitchConfig = section_class(
    "HybridRolloutSwitchConfig", None, module=_M,
    doc="Upstream's hybrid-rollout switch thresholds (read for completeness; this verl's rollout does not switch).",
    extra={"enable_switch": False, "switch_threshold_ratio": 0.4, "adaptive_switch_threshold": True,
           "switch_threshold_step_up": 0.05, "switch_threshold_step_down": 0.03,
           "switch_threshold_release_steps": 2, "switch_cost_window_size": 3})
BaseModelConfig = section_class(
    "BaseModelConfig", None, module=_M, doc="The model fields every role shares (path, tokenizer, overrides, LoRA).",
    extra={"path": "~/models/deepseek-llm-7b-chat", "tokenizer_path": None, "override_config": {},
           "external_lib": None, "trust_remote_code": False, "lora": {}})
ModuleConfig = section_class("ModuleConfig", "custom_reward_function", module=_M,
                             doc="A user module: file `path` and the `name` defined in it.")
