"""Rollout engines: generate responses for a batch of prompts."""

from .base import BaseRollout
from .hf_rollout import HFRollout, filter_logits
from .vllm_rollout import VLLMRollout

# The engines the workers can build, by `actor_rollout_ref.rollout.name`. The compat planner reads
# this (through SoftwareInfo.rollout_engines) and never picks an engine that is not listed here.
# vllm is listed whether or not vLLM is installed (its module imports vLLM only when started); the
# planner picks it only where detect finds a vLLM build that runs on the device.
ENGINES = {"hf": HFRollout, "vllm": VLLMRollout}

__all__ = ["ENGINES", "BaseRollout", "HFRollout", "VLLMRollout", "filter_logits"]
