"""Upstream's `verl.utils.dataset.dataset_utils`: upstream's SFT tensor collator and pad modes for the engine-based SFT trainer; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's SFT tensor collator and pad modes for the engine-based SFT trainer"
__getattr__ = stand_in(__name__, __verl_unsupported__)
