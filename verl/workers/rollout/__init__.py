"""Rollout engines: generate responses for a batch of prompts."""

from .base import BaseRollout
from .hf_rollout import HFRollout, filter_logits

# The engines the workers can build, by `actor_rollout_ref.rollout.name`. The compat planner reads
# this (through SoftwareInfo.rollout_engines) and never picks an engine that is not listed here.
ENGINES = {"hf": HFRollout}

__all__ = ["ENGINES", "BaseRollout", "HFRollout", "filter_logits"]
