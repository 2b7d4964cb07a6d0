"""Upstream's `verl.trainer.sft_trainer_ray`: the SFT trainer; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "the SFT trainer"
__getattr__ = stand_in(__name__, __verl_unsupported__)
