"""Upstream's `verl.experimental.separation.engine_workers`: separated trainer/rollout placement; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "separated trainer/rollout placement"
__getattr__ = stand_in(__name__, __verl_unsupported__)
