"""Reward managers, looked up by the name in the config (`reward_model.reward_manager`, default "naive").

Users can add their own with `@register("my_name")` on a class taking
(tokenizer, num_examine, compute_score, reward_fn_key, **reward_kwargs).
"""

from __future__ import annotations

from .naive import NaiveRewardManager

_REGISTRY: dict[str, type] = {}


def register(name: str):
    """Class decorator: make a reward manager selectable by `name`."""

    def decorator(cls: type) -> type:
        if _REGISTRY.get(name, cls) is not cls:
            raise ValueError(f"reward manager {name!r} is already registered to {_REGISTRY[name].__name__}")
        _REGISTRY[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str) -> type:
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown reward manager {name!r}; available: {sorted(_REGISTRY)}. Register your own class with "
            "verl.workers.reward_manager.register, or pick one of these."
        )
    return _REGISTRY[name]


register("naive")(NaiveRewardManager)

__all__ = ["NaiveRewardManager", "get_reward_manager_cls", "register"]
