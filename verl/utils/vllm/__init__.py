"""Upstream's `verl.utils.vllm`: upstream's vLLM helpers (this verl's vLLM engine is verl.workers.rollout.vllm_rollout); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's vLLM helpers (this verl's vLLM engine is verl.workers.rollout.vllm_rollout)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
