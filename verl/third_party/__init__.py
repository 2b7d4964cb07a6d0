"""Upstream's `verl.third_party`: upstream's vendored torch.distributed checkpoint helpers; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's vendored torch.distributed checkpoint helpers"
__getattr__ = stand_in(__name__, __verl_unsupported__)
