"""What every reward manager shares: the decoded batch, the checks on a score, and the loop that puts each
response's score on its last real token."""
from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import torch

from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager.abstract import AbstractRewardManager


class ScoringManagerBase(AbstractRewardManager):
    """The constructor arguments every built-in manager takes; a missing `compute_score` means the built-in
    scorers chosen by each row's data source."""

    def __init__(self, tokenizer, num_examine: int, compute_score: Callable | None = None,
                 reward_fn_key: str = "data_source") -> None:
        self.tokenizer = tokenizer
        self.num_examine = num_examine  # decoded samples printed per data source and call, for eyeballing
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key


@dataclass
class DecodedBatch:
    prompts: list[str]
    responses: list[str]
    response_lengths: list[int]
    data_sources: list
    ground_truths: list
    extra_infos: list[dict]


def decode_batch(data, tokenizer, reward_fn_key: str, strip_eos: bool = False) -> DecodedBatch:
    """Decode the valid (unpadded) prompt and response of every row; read the label and data source."""
    prompts, responses = data.batch["prompts"], data.batch["responses"]
    width = prompts.shape[-1]
    mask = data.batch["attention_mask"]
    prompt_lengths = mask[:, :width].sum(-1).tolist()
    response_lengths = mask[:, width:].sum(-1).tolist()
    columns = data.non_tensor_batch
    for key in (reward_fn_key, "reward_model"):
        if key not in columns:
            raise KeyError(f"the batch has no {key!r} column (has {sorted(columns)}); the reward manager reads the "
                           f"data source from data.reward_fn_key={reward_fn_key!r} and the label from "
                           "reward_model['ground_truth'] - check the columns of your data files")
    extras = columns.get("extra_info")
    # with a reward model, a custom scoring function reads its score as extra_info["rm_score"]
    rm_scores = data.batch["rm_scores"].sum(-1).tolist() if "rm_scores" in data.batch.keys() else None
    out = DecodedBatch([], [], [int(n) for n in response_lengths], list(columns[reward_fn_key]), [], [])
    eos = getattr(tokenizer, "eos_token", None)
    for i in range(len(data)):
        out.prompts.append(tokenizer.decode(prompts[i, width - prompt_lengths[i]:], skip_special_tokens=True))
        text = tokenizer.decode(responses[i, : response_lengths[i]], skip_special_tokens=True)
        if strip_eos and eos and text.endswith(eos):
            text = text[: -len(eos)]
        out.responses.append(text)
        out.ground_truths.append(columns["reward_model"][i].get("ground_truth"))
        extra = dict(extras[i] or {}) if extras is not None else {}
        if rm_scores is not None:
            extra["rm_score"] = rm_scores[i]
        out.extra_infos.append(extra)
    return out


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


def place_rewards(data, decoded: DecodedBatch, results: list, fn, num_examine: int,
                  adjust: Callable[[int, object, float, dict], float] | None = None):
    """(reward tensor, extra info, rewards): each row's score (a number, or a dict with "score" whose other keys
    are logged) checked and put on its response's last real token, the rest of the row 0. `adjust(i, result,
    reward, extra)` may change a row's reward (a length penalty) and log more; `num_examine` rows per data source
    are printed."""
    reward_tensor = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
    extra, shown, rewards = defaultdict(list), defaultdict(int), []
    for i, result in enumerate(results):
        source = decoded.data_sources[i]
        if isinstance(result, dict):
            if "score" not in result:
                raise KeyError(f"the reward function returned a dict without a 'score' key (keys: {sorted(result)}); "
                               "a dict result must carry the reward under 'score', other keys are logged as metrics")
            for key, value in result.items():
                extra[key].append(value)
        reward = checked_reward(result["score"] if isinstance(result, dict) else result, fn, i, source,
                                decoded.extra_infos[i])
        if adjust is not None:
            reward = adjust(i, result, reward, extra)
        rewards.append(reward)
        reward_tensor[i, max(decoded.response_lengths[i] - 1, 0)] = reward
        if shown[source] < num_examine:
            shown[source] += 1
            show(decoded, i, result)
    return reward_tensor, extra, rewards


def score_each(decoded: DecodedBatch, compute_score) -> list:
    """The scoring function called once per row."""
    return [compute_score(data_source=decoded.data_sources[i], solution_str=response,
                          ground_truth=decoded.ground_truths[i], extra_info=decoded.extra_infos[i])
            for i, response in enumerate(decoded.responses)]


def show(decoded: DecodedBatch, i: int, result) -> None:
    print("[prompt]", decoded.prompts[i])
    print("[response]", decoded.responses[i])
    print("[ground_truth]", decoded.ground_truths[i])
    for key, value in (result.items() if isinstance(result, dict) else [("score", result)]):
        print(f"[{key}]", value)
