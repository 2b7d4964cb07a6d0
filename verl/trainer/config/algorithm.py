"""Typed forms of the `algorithm` section (upstream's `AlgoConfig`, `KLControlConfig`), for code that
annotates its config; the trainer itself reads the Hydra DictConfig. Build one from the composed config
with `verl.utils.config.omega_conf_to_dataclass(config.algorithm, AlgoConfig)`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.base_config import BaseConfig

__all__ = ["AlgoConfig", "KLControlConfig"]


@dataclass
class KLControlConfig(BaseConfig):
    """`algorithm.kl_ctrl`: fixed or adaptive (target_kl over horizon) KL coefficient."""

    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class AlgoConfig(BaseConfig):
    """`algorithm`: the advantage estimator and the KL-in-reward settings, with upstream's defaults.
    `filter_groups` and `rollout_correction` are kept as plain mappings (this build does not act on them)."""

    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = "gae"
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    use_pf_ppo: bool = False
    pf_ppo: dict[str, Any] = field(default_factory=dict)
    filter_groups: Optional[dict[str, Any]] = None
    rollout_correction: Optional[dict[str, Any]] = None
