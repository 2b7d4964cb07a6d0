"""Upstream's `verl.workers.rollout.trtllm_rollout`: the TensorRT-LLM rollout; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'the TensorRT-LLM rollout'
__getattr__ = stand_in(__name__, __verl_unsupported__)
