"""Upstream's `verl.utils.modelopt.qat_utils`: NVIDIA ModelOpt quantization; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "NVIDIA ModelOpt quantization"
__getattr__ = stand_in(__name__, __verl_unsupported__)
