"""Upstream's `verl.utils.kernel.kernels`: fused kernels (linear cross-entropy, FP8); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "fused kernels (linear cross-entropy, FP8)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
