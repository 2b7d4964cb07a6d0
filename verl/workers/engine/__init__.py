"""Upstream's `verl.workers.engine`: the engine-based workers (this verl's workers are verl.workers.fsdp_workers); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "the engine-based workers (this verl's workers are verl.workers.fsdp_workers)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
