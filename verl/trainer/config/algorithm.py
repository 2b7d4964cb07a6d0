"""Typed forms of the `algorithm` section (upstream's `AlgoConfig`, `KLControlConfig`), for code that
annotates its config; the trainer itself reads the Hydra DictConfig. Build one from the composed config
with `verl.utils.config.omega_conf_to_dataclass(config.algorithm, AlgoConfig)`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.base_config import BaseConfig

from verl.utils.config_sections import section_class

__all__ = ["AlgoConfig", "FilterGroupsConfig", "KLControlConfig", "RolloutCorrectionConfig"]


@dataclass
class KLControlConfig(BaseConfig):
    """`algorithm.kl_ctrl`: fixed or adaptive (target_kl over horizon) KL coefficient."""

    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


FilterGroupsConfig = section_class(
    "FilterGroupsConfig", "algorithm.filter_groups", module=__name__,
    doc="`algorithm.filter_groups`: DAPO's dynamic sampling (groups whose `metric` does not vary are dropped).")
RolloutCorrectionConfig = section_class(
    "RolloutCorrectionConfig", "algorithm.rollout_correction", module=__name__,
    doc="`algorithm.rollout_correction`: importance weights / rejection between rollout and training policies "
        "(see `verl.trainer.ppo.rollout_corr_helper`).")
RolloutCorrectionConfig.disabled = classmethod(lambda cls: cls(rollout_is=None, rollout_rs=None))


@dataclass
class AlgoConfig(BaseConfig):
    """`algorithm`: the advantage estimator and the KL-in-reward settings, with upstream's defaults."""

    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = "gae"
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    use_pf_ppo: bool = False
    pf_ppo: dict[str, Any] = field(default_factory=dict)
    filter_groups: Optional[FilterGroupsConfig] = None
    rollout_correction: Optional[RolloutCorrectionConfig] = None
    gdpo_reward_keys: Optional[list[str]] = None
    gdpo_reward_weights: Optional[list[float]] = None
