"""Upstream's `verl.trainer.ppo.utils` import path: the worker roles, which roles a config needs, and
the RL data set / sampler factories. Each lives in one place; only `Role` is defined here."""
from __future__ import annotations

from enum import Enum

from verl.trainer.config_check import need_critic, need_reference_policy
from verl.utils.dataset.rl_dataset import create_rl_dataset, create_rl_sampler

__all__ = ["Role", "create_rl_dataset", "create_rl_sampler", "need_critic", "need_reference_policy",
           "need_reward_model"]


def need_reward_model(config) -> bool:
    """Whether the config asks for a model-based reward (`reward.reward_model.enable`)."""
    from omegaconf import OmegaConf

    return bool(OmegaConf.select(config, "reward.reward_model.enable", default=False))


class Role(Enum):
    """What a worker group does; its string form names the group (and the colocated method prefix)."""

    Actor = 0
    Rollout = 1
    ActorRollout = 2
    Critic = 3
    RefPolicy = 4
    RewardModel = 5
    ActorRolloutRef = 6

    def __str__(self) -> str:
        return {
            Role.Actor: "actor",
            Role.Rollout: "rollout",
            Role.ActorRollout: "actor_rollout",
            Role.Critic: "critic",
            Role.RefPolicy: "ref",
            Role.RewardModel: "rm",
            Role.ActorRolloutRef: "actor_rollout_ref",
        }[self]
