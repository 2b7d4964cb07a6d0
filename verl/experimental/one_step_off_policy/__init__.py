"""Upstream's `verl.experimental.one_step_off_policy`: one-step off-policy training; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "one-step off-policy training"
__getattr__ = stand_in(__name__, __verl_unsupported__)
