"""Upstream's `verl.experimental.reward_loop.reward_manager.gdpo`: the asynchronous reward loop; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "the asynchronous reward loop"
__getattr__ = stand_in(__name__, __verl_unsupported__)
