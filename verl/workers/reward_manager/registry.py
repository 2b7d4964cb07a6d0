"""Reward managers by name (`reward_model.reward_manager`), under upstream's module path."""
from __future__ import annotations

__all__ = ["REWARD_MANAGER_REGISTRY", "get_reward_manager_cls", "register"]

REWARD_MANAGER_REGISTRY: dict[str, type] = {}


def register(name: str):
    """Class decorator: make a reward manager selectable by `name`."""

    def decorator(cls: type) -> type:
        if REWARD_MANAGER_REGISTRY.get(name, cls) is not cls:
            raise ValueError(f"reward manager {name!r} is already registered to "
                             f"{REWARD_MANAGER_REGISTRY[name].__name__}")
        REWARD_MANAGER_REGISTRY[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str) -> type:
    if name not in REWARD_MANAGER_REGISTRY:
        raise ValueError(
            f"unknown reward manager {name!r}; available: {sorted(REWARD_MANAGER_REGISTRY)}. Register your own class "
            "with verl.workers.reward_manager.register, or pick one of these."
        )
    return REWARD_MANAGER_REGISTRY[name]
