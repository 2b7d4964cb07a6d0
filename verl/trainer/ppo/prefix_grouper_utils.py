"""Upstream's `verl.trainer.ppo.prefix_grouper_utils`: prefix-grouped forward passes (PrefixGrouper); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'prefix-grouped forward passes (PrefixGrouper)'
__getattr__ = stand_in(__name__, __verl_unsupported__)
