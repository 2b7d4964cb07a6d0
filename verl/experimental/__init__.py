"""Upstream's `verl.experimental`: upstream's experimental trainers; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's experimental trainers"
__getattr__ = stand_in(__name__, __verl_unsupported__)
