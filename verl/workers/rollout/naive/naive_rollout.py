"""Upstream's `verl.workers.rollout.naive.naive_rollout`: upstream's naive rollout (this verl's built-in engine is verl.workers.rollout.hf_rollout.HFRollout); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's naive rollout (this verl's built-in engine is verl.workers.rollout.hf_rollout.HFRollout)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
