"""Upstream's `verl.models.transformers.qwen2`: upstream's transformers monkey patches (this verl's attention is set by verl.compat); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's transformers monkey patches (this verl's attention is set by verl.compat)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
