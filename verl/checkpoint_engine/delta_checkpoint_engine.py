"""Upstream's `verl.checkpoint_engine.delta_checkpoint_engine`: checkpoint engines (weight transfer to separate rollout servers); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "checkpoint engines (weight transfer to separate rollout servers)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
