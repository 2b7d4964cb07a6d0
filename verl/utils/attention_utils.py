"""Upstream's `verl.utils.attention_utils`: flash-attn's unpad/pad helpers (this verl packs sequences through verl.compat's attention plan); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "flash-attn's unpad/pad helpers (this verl packs sequences through verl.compat's attention plan)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
