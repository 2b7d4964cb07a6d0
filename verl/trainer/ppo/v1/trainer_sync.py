"""Upstream's `verl.trainer.ppo.v1.trainer_sync`: the v1 (transfer-queue) PPO trainers; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "the v1 (transfer-queue) PPO trainers"
__getattr__ = stand_in(__name__, __verl_unsupported__)
