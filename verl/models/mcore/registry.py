"""Upstream's `verl.models.mcore.registry`: Megatron-Core models; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "Megatron-Core models"
__getattr__ = stand_in(__name__, __verl_unsupported__)
