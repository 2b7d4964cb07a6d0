"""Upstream's `verl.experimental.agent_loop.utils`: helpers of upstream's agent-loop inference servers. This verl
runs agent loops inside its rollout workers (`verl.workers.rollout.multi_turn`), so any name here raises
NotImplementedError."""
from verl._unsupported import stand_in

__verl_unsupported__ = "the agent loop's inference-server helpers (agent loops run in the rollout workers here)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
