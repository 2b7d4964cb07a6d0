"""Upstream's `verl.utils.tokenizer.continuous_token`: continuous-token chat builders for the async agent loop; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'continuous-token chat builders for the async agent loop'
__getattr__ = stand_in(__name__, __verl_unsupported__)
