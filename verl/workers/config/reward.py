"""The reward sections (`reward`, `reward.reward_model`, `reward.sandbox_fusion`) typed."""
from __future__ import annotations

from verl.trainer.config.config import ModuleConfig
from verl.utils.config_sections import section_class

__all__ = ["SandboxFusionConfig", "RewardConfig", "RewardModelConfig"]

SandboxFusionConfig = section_class("SandboxFusionConfig", "reward.sandbox_fusion", module=__name__,
                                    doc="A sandbox-fusion code execution service: URL, concurrency, memory limit.")
RewardManagerConfig = section_class("RewardManagerConfig", "reward.reward_manager", nested={"module": ModuleConfig},
                                    module=__name__, doc="Which reward manager turns scores into token rewards.")
RewardModelConfig = section_class("RewardModelConfig", "reward.reward_model", module=__name__,
                                  doc="`reward.reward_model`: a model-based reward and its resources.")
RewardConfig = section_class("RewardConfig", "reward",
                             nested={"reward_manager": RewardManagerConfig, "reward_model": RewardModelConfig,
                                     "sandbox_fusion": SandboxFusionConfig, "custom_reward_function": ModuleConfig},
                             module=__name__, doc="`reward`: the reward manager, reward model and sandbox.")
