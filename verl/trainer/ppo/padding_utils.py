"""Upstream's `verl.trainer.ppo.padding_utils`: the padding of batches to a divisible size with synthetic sequences for the engine-based workers; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'the padding of batches to a divisible size with synthetic sequences for the engine-based workers'
__getattr__ = stand_in(__name__, __verl_unsupported__)
