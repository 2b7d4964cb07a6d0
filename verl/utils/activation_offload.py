"""Upstream's `verl.utils.activation_offload`: upstream's activation offloading hooks (this verl offloads by the compat plan); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's activation offloading hooks (this verl offloads by the compat plan)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
