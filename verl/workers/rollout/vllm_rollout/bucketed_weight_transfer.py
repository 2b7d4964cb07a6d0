"""Upstream's `verl.workers.rollout.vllm_rollout.bucketed_weight_transfer`: upstream's bucketed weight transfer over IPC and shared memory (this verl pushes weights to vLLM in the worker's own process); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's bucketed weight transfer over IPC and shared memory (this verl pushes weights to vLLM in the worker's own process)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
