"""Upstream's `verl.utils.reward_score.rlla`: the RLLA tool-call reward scorer; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'the RLLA tool-call reward scorer'
__getattr__ = stand_in(__name__, __verl_unsupported__)
