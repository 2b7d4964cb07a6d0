"""Upstream's `verl.plugin.platform.platform_manager`: the platform plugin layer (device decisions are verl.compat's); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "the platform plugin layer (device decisions are verl.compat's)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
