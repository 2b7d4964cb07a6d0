"""`BaseTool`: the interface a multi-turn rollout drives for each tool (create, execute, reward, release).
Subclass it and override `execute` (and the others where the tool keeps state per trajectory)."""
from __future__ import annotations

from typing import Any, Optional
from uuid import uuid4

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

__all__ = ["BaseTool"]


class BaseTool:
    """A tool described by an OpenAI function schema; `config` is the tool's entry of the tools config file."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema]):
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__}: no tool schema given and get_openai_tool_schema() returned none")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        """Start the tool's state for one trajectory; (instance id, a response to show the model, empty here)."""
        return (instance_id if instance_id is not None else str(uuid4())), ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Run the tool: (response, step reward, metrics). The base tool only acknowledges the call."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """The reward the tool's final state earns the trajectory."""
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        """Drop the trajectory's state."""
