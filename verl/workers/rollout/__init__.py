"""Rollout engines: generate responses for a batch of prompts."""

from verl.compat.engines import check_registry

from .base import BaseRollout
from .hf_rollout import HFRollout, filter_logits

# The engines the workers can build, by `actor_rollout_ref.rollout.name`: exactly those that
# verl.compat.engines lists (the planner picks only from that list).
ENGINES = {"hf": HFRollout}
check_registry(ENGINES)

__all__ = ["ENGINES", "BaseRollout", "HFRollout", "filter_logits"]
