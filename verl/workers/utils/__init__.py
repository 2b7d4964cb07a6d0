"""Upstream's `verl.workers.utils`: the engine-based workers' loss and padding helpers; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "the engine-based workers' loss and padding helpers"
__getattr__ = stand_in(__name__, __verl_unsupported__)
