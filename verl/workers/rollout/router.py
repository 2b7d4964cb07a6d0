"""Upstream's `verl.workers.rollout.router`: upstream's request router for rollout servers (this verl's rollout runs inside the rollout worker); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's request router for rollout servers (this verl's rollout runs inside the rollout worker)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
