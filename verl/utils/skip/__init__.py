"""Upstream's `verl.utils.skip`: rollout skipping (replaying dumped rollouts); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "rollout skipping (replaying dumped rollouts)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
