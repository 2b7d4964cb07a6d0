"""Upstream's `verl.workers.rollout.vllm_rollout.vllm_pd_replica`: prefill/decode-disaggregated vLLM replicas; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'prefill/decode-disaggregated vLLM replicas'
__getattr__ = stand_in(__name__, __verl_unsupported__)
