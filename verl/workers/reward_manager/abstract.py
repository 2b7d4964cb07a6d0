"""`AbstractRewardManager`: the interface a reward manager registered with `@register(name)` implements."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

__all__ = ["AbstractRewardManager", "RawRewardFn"]

RawRewardFn = Callable[..., Any]


class AbstractRewardManager(ABC):
    """Built with (tokenizer, num_examine, compute_score, reward_fn_key); called on a rollout batch, it returns
    the token-level reward tensor, or {"reward_tensor", "reward_extra_info"} with `return_dict`."""

    @abstractmethod
    def __init__(self, tokenizer: Any, num_examine: int, compute_score: RawRewardFn | None,
                 reward_fn_key: str = "data_source", **kwargs: Any):
        ...

    @abstractmethod
    def __call__(self, data, return_dict: bool = False):
        ...

    def _extract_reward_from_rm_scores(self, data, return_dict: bool = False):
        """The batch's precomputed `rm_scores` as the reward (a reward model already scored it), else None."""
        if "rm_scores" not in data.batch.keys():
            return None
        scores = data.batch["rm_scores"]
        if not return_dict:
            return scores
        extra_keys = data.meta_info.get("reward_extra_keys", [])
        return {"reward_tensor": scores,
                "reward_extra_info": {key: data.non_tensor_batch[key] for key in extra_keys}}
