"""Upstream's `verl.workers.rollout.sglang_rollout.delta_loader`: upstream's SGLang rollout server (this verl rolls out with its HF engine or vLLM); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's SGLang rollout server (this verl rolls out with its HF engine or vLLM)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
