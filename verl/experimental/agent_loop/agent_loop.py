"""Upstream's `verl.experimental.agent_loop.agent_loop`: agent loops (multi-turn, tool-calling rollouts); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "agent loops (multi-turn, tool-calling rollouts)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
