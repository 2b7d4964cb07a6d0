"""Upstream's `verl.utils.transferqueue_utils`: the transfer queue; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "the transfer queue"
__getattr__ = stand_in(__name__, __verl_unsupported__)
