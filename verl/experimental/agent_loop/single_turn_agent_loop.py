"""`single_turn_agent`: one model turn, as the plain rollout."""
from __future__ import annotations

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, register

__all__ = ["SingleTurnAgentLoop"]


@register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    async def on_generated(self, token_ids: list[int], ended: bool) -> None:
        self._append(token_ids, model_made=True)
        self.assistant_turns += 1
        self.done = True
