"""Upstream's `verl.experimental.fully_async_policy.dynamic_schedule.fixed_ratio_policy`: fully asynchronous policy training; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "fully asynchronous policy training"
__getattr__ = stand_in(__name__, __verl_unsupported__)
