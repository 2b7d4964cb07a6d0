"""Build the reward function the trainer calls: a reward manager around a scoring function.

The scoring function is the user's (`custom_reward_function.path` / `.name`) when set, otherwise the
built-in rules of `verl.utils.reward_score.default_compute_score`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any, Callable

from verl.utils.import_utils import load_object_from_file
from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager import get_reward_manager_cls

DEFAULT_FUNCTION_NAME = "compute_score"


def _select(config, dotted: str, default=None):
    """`config.a.b` for a DictConfig or a plain dict; `default` where any level is missing or null."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) and not hasattr(node, "get"):
            return default
        node = node.get(part)
        if node is None:
            return default
    return node


def _call_with_kwargs(fn: Callable, fixed_kwargs: dict, *args, **kwargs):
    """Call `fn` with the config's reward_kwargs on top of the per-sample arguments."""
    return fn(*args, **{**kwargs, **fixed_kwargs})


def get_custom_reward_fn(config) -> Callable | None:
    """The user's scoring function from `custom_reward_function`, or None when no path is set.

    Read from the top-level `custom_reward_function` (the key of upstream's scripts) or, failing that,
    `reward.custom_reward_function` (upstream 0.9.1's new home). `reward_kwargs` there are passed to
    every call.
    """
    for setting in ("custom_reward_function", "reward.custom_reward_function"):
        path = _select(config, f"{setting}.path")
        if path:
            break
    else:
        return None

    name = _select(config, f"{setting}.name", DEFAULT_FUNCTION_NAME)
    fn = load_object_from_file(path, name, setting)
    if not callable(fn):
        raise TypeError(f"{setting}.name={name!r} in {path} is a {type(fn).__name__}, not a function")
    print(f"using custom reward function {name!r} from {path}")

    reward_kwargs = dict(_select(config, f"{setting}.reward_kwargs", {}))
    return functools.partial(_call_with_kwargs, fn, reward_kwargs) if reward_kwargs else fn


def _reward_manager_cls(config) -> type:
    """The class named by the config: from verl's registry, or (source=importlib) from the user's file."""
    name = _select(config, "reward_model.reward_manager") or _select(config, "reward.reward_manager.name", "naive")
    source = _select(config, "reward.reward_manager.source", "register")
    if source == "register":
        return get_reward_manager_cls(name)
    if source == "importlib":
        path = _select(config, "reward.reward_manager.module.path")
        if not path:
            raise ValueError("reward.reward_manager.source=importlib needs reward.reward_manager.module.path")
        return load_object_from_file(path, name, "reward.reward_manager")
    raise ValueError(f"reward.reward_manager.source={source!r}; use 'register' or 'importlib'")


class RewardModelScores:
    """The reward when a reward model is on and no custom scoring function is set: the model's
    `rm_scores` (one score at each response's last token), as upstream 0.9.1 scores such runs."""

    def __call__(self, data, return_dict: bool = False):
        if "rm_scores" not in data.batch.keys():
            raise KeyError("reward_model.enable=True but the batch has no rm_scores: the reward model worker "
                           "did not score it")
        reward_tensor = data.batch["rm_scores"]
        return {"reward_tensor": reward_tensor, "reward_extra_info": {}} if return_dict else reward_tensor


def _default_scorer(config):
    """`default_compute_score`, pointed at the sandbox-fusion server `reward.sandbox_fusion.url` (or the older
    top-level `sandbox_fusion.url`) for code data sources when one is configured."""
    section = _select(config, "reward.sandbox_fusion", None) or {}
    if not section.get("url"):
        section = _select(config, "sandbox_fusion", None) or {}
    if not section.get("url"):
        return default_compute_score
    return functools.partial(default_compute_score, sandbox_fusion_url=section["url"],
                             memory_limit_mb=section.get("memory_limit_mb") or 1024)


def load_reward_manager(config, tokenizer, num_examine: int = 0, **reward_kwargs: Any):
    """The reward manager named in the config, wrapping the custom or built-in scoring function.

    `num_examine` is how many decoded samples per data source it prints each call (upstream uses 0 for
    training and 1 for validation). With a reward model (`reward_model.enable`) the model's score is the
    reward, unless a custom scoring function is set: that function then decides, reading the model's
    score as `extra_info["rm_score"]`.
    """
    from verl.compat.planning.reward_model import reward_model_enabled

    custom = get_custom_reward_fn(config)
    if custom is None and reward_model_enabled(config):
        return RewardModelScores()
    manager_cls = _reward_manager_cls(config)
    compute_score = custom or _default_scorer(config)
    return manager_cls(
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=compute_score,
        reward_fn_key=_select(config, "data.reward_fn_key", "data_source"),
        **reward_kwargs,
    )


def compute_reward(data, reward_fn) -> tuple[Any, dict[str, list]]:
    """Run `reward_fn` on a batch: (token-level reward tensor, extra per-sample metrics by name)."""
    params = inspect.signature(reward_fn).parameters.values()
    takes_return_dict = any(p.name == "return_dict" or p.kind is p.VAR_KEYWORD for p in params)
    if not takes_return_dict:
        return reward_fn(data), {}
    result = reward_fn(data, return_dict=True)
    if not isinstance(result, Mapping):      # a function that takes **kwargs may still return the tensor
        return result, {}
    return result["reward_tensor"], dict(result.get("reward_extra_info", {}) or {})
