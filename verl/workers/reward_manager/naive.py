"""Turn a batch of rollouts into token-level rewards, one rule-scored response at a time."""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections import defaultdict
from typing import Any, Callable

import torch

from verl.utils.reward_score import default_compute_score


def describe_function(fn) -> str:
    """`name (file)` of a scoring function, looking through the partial that adds reward_kwargs."""
    while isinstance(fn, functools.partial):
        wrapped = fn.args[0] if fn.args and callable(fn.args[0]) else None
        fn = wrapped if wrapped is not None and getattr(fn.func, "__name__", "") == "_call_with_kwargs" else fn.func
    name = getattr(fn, "__qualname__", None) or repr(fn)
    try:
        return f"{name} ({inspect.getsourcefile(fn)})"
    except TypeError:
        return name


def checked_reward(value, fn, index: int, data_source, extra_info: dict) -> float:
    """The reward as a finite float, or an error naming the scoring function, the sample and its data source."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    where = f"sample {index} of the batch (data_source={data_source!r}"
    where += f", extra_info.index={extra_info['index']!r})" if "index" in extra_info else ")"
    if not isinstance(value, numbers.Real):
        raise TypeError(
            f"the reward function {describe_function(fn)} returned {value!r} ({type(value).__name__}) for {where}; "
            "it must return a number, or a dict whose 'score' is a number"
        )
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(
            f"the reward function {describe_function(fn)} returned {value} for {where}; rewards must be finite "
            "numbers. This is the reward function's output, not a training instability: fix the function "
            "(e.g. a division by zero or float('nan') for an unparsable answer; return 0.0 instead)."
        )
    return value


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
        prompts = data.batch["prompts"]
        responses = data.batch["responses"]
        prompt_len = prompts.shape[-1]
        mask = data.batch["attention_mask"]
        prompt_valid = mask[:, :prompt_len].sum(-1).tolist()
        response_valid = mask[:, prompt_len:].sum(-1).tolist()

        columns = data.non_tensor_batch
        for key in (self.reward_fn_key, "reward_model"):
            if key not in columns:
                raise KeyError(
                    f"the batch has no {key!r} column (has {sorted(columns)}); the reward manager reads the data "
                    f"source from data.reward_fn_key={self.reward_fn_key!r} and the label from "
                    "reward_model['ground_truth'] - check the columns of your data files"
                )
        extra_infos = columns.get("extra_info")
        # with a reward model, a custom scoring function reads its score as extra_info["rm_score"]
        rm_scores = data.batch["rm_scores"].sum(-1).tolist() if "rm_scores" in data.batch.keys() else None

        reward_tensor = torch.zeros_like(responses, dtype=torch.float32)
        reward_extra_info = defaultdict(list)
        shown = defaultdict(int)

        for i in range(len(data)):
            n_prompt, n_response = prompt_valid[i], response_valid[i]
            prompt_str = self.tokenizer.decode(prompts[i, prompt_len - n_prompt :], skip_special_tokens=True)
            response_str = self.tokenizer.decode(responses[i, :n_response], skip_special_tokens=True)
            data_source = columns[self.reward_fn_key][i]
            ground_truth = columns["reward_model"][i]["ground_truth"]
            extra_info = dict(extra_infos[i] or {}) if extra_infos is not None else {}
            if rm_scores is not None:
                extra_info["rm_score"] = rm_scores[i]

            result = self.compute_score(
                data_source=data_source, solution_str=response_str, ground_truth=ground_truth, extra_info=extra_info
            )
            if isinstance(result, dict):
                if "score" not in result:
                    raise KeyError(
                        f"the reward function returned a dict without a 'score' key (keys: {sorted(result)}); "
                        "a dict result must carry the reward under 'score', other keys are logged as metrics"
                    )
                reward = result["score"]
                for key, value in result.items():
                    reward_extra_info[key].append(value)
            else:
                reward = result
            reward = checked_reward(reward, self.compute_score, i, data_source, extra_info)
            reward_tensor[i, max(n_response - 1, 0)] = reward

            if shown[data_source] < self.num_examine:
                shown[data_source] += 1
                print("[prompt]", prompt_str)
                print("[response]", response_str)
                print("[ground_truth]", ground_truth)
                for key, value in (result.items() if isinstance(result, dict) else [("score", result)]):
                    print(f"[{key}]", value)

        if return_dict:
            return {"reward_tensor": reward_tensor, "reward_extra_info": reward_extra_info}
        return reward_tensor
