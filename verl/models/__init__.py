"""Upstream's `verl.models`: upstream's model registry and patches; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's model registry and patches"
__getattr__ = stand_in(__name__, __verl_unsupported__)
