"""Rollout engines: generate responses for a batch of prompts."""

from verl.compat.device.engines import check_registry

from .base import BaseRollout
from .hf_rollout import HFRollout, filter_logits
from .vllm_rollout import VLLMRollout

# The engines the workers can build, by `actor_rollout_ref.rollout.name`: exactly those that
# verl.compat.device.engines lists (the planner picks only from that list, and picks vllm only where detect
# finds a vLLM build that runs on the device; its module imports vLLM only when the engine starts).
ENGINES = {"hf": HFRollout, "vllm": VLLMRollout}
check_registry(ENGINES)

__all__ = ["ENGINES", "BaseRollout", "HFRollout", "VLLMRollout", "filter_logits"]
