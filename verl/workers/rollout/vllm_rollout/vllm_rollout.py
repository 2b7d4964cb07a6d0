"""Upstream's `verl.workers.rollout.vllm_rollout.vllm_rollout`: upstream's vLLM HTTP server adapter (this verl runs vLLM inside the rollout worker: verl.workers.rollout.vllm_rollout.VLLMRollout); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's vLLM HTTP server adapter (this verl runs vLLM inside the rollout worker: verl.workers.rollout.vllm_rollout.VLLMRollout)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
