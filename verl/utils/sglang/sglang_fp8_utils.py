"""Upstream's `verl.utils.sglang.sglang_fp8_utils`: SGLang; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "SGLang"
__getattr__ = stand_in(__name__, __verl_unsupported__)
