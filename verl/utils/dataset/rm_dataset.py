"""Upstream's `verl.utils.dataset.rm_dataset`: the pairwise reward-model dataset (reward model training); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'the pairwise reward-model dataset (reward model training)'
__getattr__ = stand_in(__name__, __verl_unsupported__)
