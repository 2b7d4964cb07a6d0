"""`BatchRewardManager` (registered as "batch"): one call of the scoring function for the whole batch,
for scorers that are cheaper batched (a remote judge, a vectorised verifier)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from verl.workers.reward_manager._common import ScoringManagerBase, decode_batch, place_rewards


class BatchRewardManager(ScoringManagerBase):
    """`compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=, **reward_kwargs)` returns one
    score (a number, or a dict with "score") per row; each lands on its response's last token."""

    def __init__(self, tokenizer, num_examine: int, compute_score: Callable[..., Any],
                 reward_fn_key: str = "data_source", **reward_kwargs) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
        self.reward_kwargs = reward_kwargs

    def verify(self, data) -> list:
        """The scoring function's raw results for every row of `data`."""
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        return self._score(decoded)

    def _score(self, decoded) -> list:
        scores = list(self.compute_score(data_sources=decoded.data_sources, solution_strs=decoded.responses,
                                         ground_truths=decoded.ground_truths, extra_infos=decoded.extra_infos,
                                         **self.reward_kwargs))
        if len(scores) != len(decoded.responses):
            raise ValueError(f"the batch reward function returned {len(scores)} scores for "
                             f"{len(decoded.responses)} responses")
        return scores

    def __call__(self, data, return_dict: bool = False):
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        scores = self._score(decoded)
        reward_tensor, extra, rewards = place_rewards(data, decoded, scores, self.compute_score, self.num_examine)
        data.batch["acc"] = torch.tensor(rewards, dtype=torch.float32)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra}
        return reward_tensor
