"""Upstream's NPU attention helpers (Ascend NPUs): not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "Ascend NPUs"
__getattr__ = stand_in(__name__, __verl_unsupported__)
