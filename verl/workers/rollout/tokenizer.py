"""Upstream's `verl.workers.rollout.tokenizer`: upstream's hybrid-engine tokenizer interface; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's hybrid-engine tokenizer interface"
__getattr__ = stand_in(__name__, __verl_unsupported__)
