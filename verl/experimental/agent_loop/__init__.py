"""Agent loops: how one sample's rollout unfolds turn by turn (upstream's registry names `single_turn_agent`
and `tool_agent`; a data row picks one with its `agent_name` column). The batched driver that runs them over
a rollout engine is `verl.workers.rollout.multi_turn.MultiTurnRollout`."""
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, get_agent_loop_class, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

__all__ = ["AgentLoopBase", "AgentLoopOutput", "SingleTurnAgentLoop", "ToolAgentLoop", "get_agent_loop_class",
           "register"]
