"""`DAPORewardManager` (registered as "dapo"): per-sample scores plus DAPO's soft overlong penalty
(arXiv:2503.14476): with `overlong_buffer_cfg.enable`, a response longer than
max_resp_len - buffer.len loses (excess / buffer.len) * penalty_factor, at most penalty_factor."""
from __future__ import annotations

from typing import Any, Callable

from verl.workers.reward_manager._common import ScoringManagerBase, decode_batch, place_rewards, score_each


class DAPORewardManager(ScoringManagerBase):
    """`overlong_buffer_cfg` has `enable`, `len`, `penalty_factor`, `log` (as upstream's
    `reward_model.overlong_buffer`); pass it and `max_resp_len` through `reward_model.reward_kwargs`."""

    def __init__(self, tokenizer, num_examine: int, compute_score: Callable[..., Any] | None = None,
                 reward_fn_key: str = "data_source", max_resp_len: int | None = None, overlong_buffer_cfg=None) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
        self.max_resp_len = max_resp_len
        self.overlong_buffer_cfg = overlong_buffer_cfg
        if self._penalise():
            buffer_len = overlong_buffer_cfg.get("len")
            if max_resp_len is None:
                raise ValueError("the DAPO overlong penalty needs max_resp_len (data.max_response_length)")
            if not buffer_len or buffer_len <= 0 or max_resp_len < buffer_len:
                raise ValueError(f"overlong_buffer.len={buffer_len} must be > 0 and <= max_resp_len={max_resp_len}; "
                                 "set overlong_buffer.enable=false to switch the penalty off")

    def _penalise(self) -> bool:
        return self.overlong_buffer_cfg is not None and bool(self.overlong_buffer_cfg.get("enable", False))

    def _overlong_penalty(self, length: int) -> float:
        cfg = self.overlong_buffer_cfg
        excess = length - (self.max_resp_len - cfg["len"])
        return min(-excess / cfg["len"] * cfg["penalty_factor"], 0.0)

    def _adjust(self, length: int, result, reward: float, extra: dict) -> float:
        """A plain-number score is logged as `acc`; the overlong penalty (when enabled) is added and logged."""
        if not isinstance(result, dict):
            extra["acc"].append(result)
        if not self._penalise():
            return reward
        penalty = self._overlong_penalty(length)
        if self.overlong_buffer_cfg.get("log", False):
            extra["overlong_reward"].append(penalty)
            extra["overlong"].append(penalty < 0)
        return reward + penalty

    def __call__(self, data, return_dict: bool = False):
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key, strip_eos=True)
        results = score_each(decoded, self.compute_score)
        reward_tensor, extra, _ = place_rewards(data, decoded, results, self.compute_score, self.num_examine,
                                                adjust=lambda i, result, reward, extra: self._adjust(
                                                    decoded.response_lengths[i], result, reward, extra))
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra}
        return reward_tensor
