"""Upstream's `verl.utils.debug.trajectory_tracker`: trajectory tracking to HDFS through Ray actors; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'trajectory tracking to HDFS through Ray actors'
__getattr__ = stand_in(__name__, __verl_unsupported__)
