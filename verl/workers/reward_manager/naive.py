"""Turn a batch of rollouts into token-level rewards, one rule-scored response at a time."""

from __future__ import annotations

from typing import Any, Callable

from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager._common import decode_batch, place_rewards, score_each


class NaiveRewardManager:
    """Decode each response, score it, and put the score on its last real token.

    PPO/GRPO treat an outcome reward as arriving when the response ends, so every other position of the
    reward tensor stays 0 (KL penalties, if any, are added to it later by the trainer).
    """

    def __init__(
        self,
        tokenizer,
        num_examine: int,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
    ) -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine  # decoded samples printed per data source and call, for eyeballing
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key

    def __call__(self, data, return_dict: bool = False):
        """`data` is a DataProto with prompts, responses and attention_mask, plus the dataset's columns."""
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        results = score_each(decoded, self.compute_score)
        reward_tensor, extra, _ = place_rewards(data, decoded, results, self.compute_score, self.num_examine)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra}
        return reward_tensor
