"""Upstream's `verl.utils.checkpoint.checkpoint_handler`: the checkpoint handler of the engine-based trainers; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'the checkpoint handler of the engine-based trainers'
__getattr__ = stand_in(__name__, __verl_unsupported__)
