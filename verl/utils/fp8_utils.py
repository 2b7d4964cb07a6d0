"""Upstream's `verl.utils.fp8_utils`: FP8 training and rollout; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "FP8 training and rollout"
__getattr__ = stand_in(__name__, __verl_unsupported__)
