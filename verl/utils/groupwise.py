"""Upstream's `verl.utils.groupwise`: group-wise statistics on device for the engine-based workers; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'group-wise statistics on device for the engine-based workers'
__getattr__ = stand_in(__name__, __verl_unsupported__)
