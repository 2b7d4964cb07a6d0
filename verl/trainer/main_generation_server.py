"""Upstream's `verl.trainer.main_generation_server`: the generation server entry point; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "the generation server entry point"
__getattr__ = stand_in(__name__, __verl_unsupported__)
