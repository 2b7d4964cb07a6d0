"""Upstream's `verl.workers.rollout.schemas`: upstream's SGLang-era multi-turn request schemas (this verl's multi-turn state lives in verl.experimental.agent_loop); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's SGLang-era multi-turn request schemas (this verl's multi-turn state lives in verl.experimental.agent_loop)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
