"""Rollout engines: generate responses for a batch of prompts."""

from .base import BaseRollout
from .hf_rollout import HFRollout, filter_logits

__all__ = ["BaseRollout", "HFRollout", "filter_logits"]
