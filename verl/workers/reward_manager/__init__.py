"""Reward managers, looked up by the name in the config (`reward_model.reward_manager`, default "naive").

Users can add their own with `@register("my_name")` on a class taking
(tokenizer, num_examine, compute_score, reward_fn_key, **reward_kwargs).
"""

from __future__ import annotations

from .batch import BatchRewardManager
from .dapo import DAPORewardManager
from .abstract import AbstractRewardManager
from .naive import NaiveRewardManager
from .prime import PrimeRewardManager
from .registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register

register("naive")(NaiveRewardManager)
register("batch")(BatchRewardManager)
register("dapo")(DAPORewardManager)
register("prime")(PrimeRewardManager)

__all__ = ["AbstractRewardManager", "BatchRewardManager", "DAPORewardManager", "NaiveRewardManager",
           "PrimeRewardManager", "get_reward_manager_cls", "register"]
