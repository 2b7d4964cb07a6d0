"""`Gsm8kTool`: upstream's GSM8K example tool (`calc_gsm8k_reward`). The model submits an answer; the tool
grades it against the row's ground truth (from `tools_kwargs.calc_gsm8k_reward.create_kwargs`) and says so."""
from __future__ import annotations

from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.reward_score import gsm8k

__all__ = ["Gsm8kTool"]

# A repeated answer that does not improve the grade costs this much tool reward (upstream's value).
NO_IMPROVEMENT_PENALTY = -0.05


class Gsm8kTool(BaseTool):
    """Grades a submitted GSM8K answer; keeps the last answer and grade per trajectory."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema]):
        super().__init__(config, tool_schema)
        self._state: dict[str, dict[str, Any]] = {}

    async def create(self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None,
                     **kwargs) -> tuple[str, ToolResponse]:
        if ground_truth is None:   # upstream's agent loop passes the row's kwargs as create_kwargs={...}
            ground_truth = (kwargs.get("create_kwargs") or {}).get("ground_truth")
        instance_id = instance_id if instance_id is not None else str(uuid4())
        self._state[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        answer = parameters.get("answer", "") if isinstance(parameters, dict) else ""
        answer = answer if isinstance(answer, str) else str(answer)
        state = self._state[instance_id]
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = await self.calc_reward(instance_id)
        tool_reward = 0.0 if reward > state["reward"] else NO_IMPROVEMENT_PENALTY
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer!r} reward={reward!r}"), tool_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        state = self._state[instance_id]
        if state["ground_truth"] is None:
            raise ValueError("calc_gsm8k_reward has no ground truth: the row needs extra_info.tools_kwargs."
                             "calc_gsm8k_reward.create_kwargs.ground_truth (see examples/data_preprocess/"
                             "gsm8k_multiturn_w_tool.py)")
        return float(gsm8k.compute_score(state["response"], str(state["ground_truth"]), method="flexible",
                                         format_score=0.0, score=1.0))

    async def release(self, instance_id: str, **kwargs) -> None:
        self._state.pop(instance_id, None)
