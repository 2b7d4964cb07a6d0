"""`DAPORewardManager` (registered as "dapo"): per-sample scores plus DAPO's soft overlong penalty
(arXiv:2503.14476): with `overlong_buffer_cfg.enable`, a response longer than
max_resp_len - buffer.len loses (excess / buffer.len) * penalty_factor, at most penalty_factor."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch

from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager._decode import decode_batch, show


class DAPORewardManager:
    """`overlong_buffer_cfg` has `enable`, `len`, `penalty_factor`, `log` (as upstream's
    `reward_model.overlong_buffer`); pass it and `max_resp_len` through `reward_model.reward_kwargs`."""

    def __init__(self, tokenizer, num_examine: int, compute_score: Callable[..., Any] | None = None,
                 reward_fn_key: str = "data_source", max_resp_len: int | None = None, overlong_buffer_cfg=None) -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
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

    def __call__(self, data, return_dict: bool = False):
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key, strip_eos=True)
        reward_tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        extra = defaultdict(list)
        shown = defaultdict(int)
        for i, response in enumerate(decoded.responses):
            result = self.compute_score(data_source=decoded.data_sources[i], solution_str=response,
                                        ground_truth=decoded.ground_truths[i], extra_info=decoded.extra_infos[i])
            if isinstance(result, dict):
                reward = result["score"]
                for key, value in result.items():
                    extra[key].append(value)
            else:
                reward = result
                extra["acc"].append(result)
            if self._penalise():
                penalty = self._overlong_penalty(decoded.response_lengths[i])
                reward += penalty
                if self.overlong_buffer_cfg.get("log", False):
                    extra["overlong_reward"].append(penalty)
                    extra["overlong"].append(penalty < 0)
            reward_tensor[i, max(decoded.response_lengths[i] - 1, 0)] = reward
            source = decoded.data_sources[i]
            if shown[source] < self.num_examine:
                shown[source] += 1
                show(decoded, i, result)
        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": extra}
        return reward_tensor
