"""Upstream's `verl.utils.qat`: quantization-aware training; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "quantization-aware training"
__getattr__ = stand_in(__name__, __verl_unsupported__)
