"""Turn a batch of rollouts into token-level rewards, one rule-scored response at a time."""

from __future__ import annotations

from verl.workers.reward_manager._common import ScoringManagerBase, decode_batch, place_rewards, score_each


class NaiveRewardManager(ScoringManagerBase):
    """Decode each response, score it, and put the score on its last real token.

    PPO/GRPO treat an outcome reward as arriving when the response ends, so every other position of the
    reward tensor stays 0 (KL penalties, if any, are added to it later by the trainer).
    """

    def __call__(self, data, return_dict: bool = False):
        """`data` is a DataProto with prompts, responses and attention_mask, plus the dataset's columns."""
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        results = score_each(decoded, self.compute_score)
        reward_tensor, extra, _ = place_rewards(data, decoded, results, self.compute_score, self.num_examine)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra}
        return reward_tensor
