"""`tool_agent`: the model may call tools; each call runs, and its response is appended as tool messages in
the tokenizer's chat template (response_mask 0), then the model continues. Stops at a turn without calls,
at max_assistant_turns / max_user_turns, or when the response budget is spent."""
from __future__ import annotations

import asyncio
import json
import logging

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, register
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.tools.function_tool import FunctionTool, normalize_function_tool_return
from verl.tools.schemas import ToolResponse

__all__ = ["ToolAgentLoop", "tool_message_ids", "truncate_tool_response"]

logger = logging.getLogger(__name__)

_ANCHOR = [{"role": "system", "content": "."}]


def truncate_tool_response(text: str, max_length: int, side: str) -> str:
    """Cut a tool response to `max_length` characters, marking the cut (left: keep the end; right: keep the
    start; middle: keep both ends)."""
    if not text or len(text) <= max_length:
        return text
    if side == "left":
        return "(truncated)..." + text[-max_length:]
    if side == "right":
        return text[:max_length] + "...(truncated)"
    if side == "middle":
        half = max_length // 2
        return text[:half] + "...(truncated)..." + (text[-half:] if half else "")
    raise ValueError(f"actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side={side!r}: use left, "
                     "middle or right")


def tool_message_ids(tokenizer, contents: list[str]) -> list[int]:
    """The tokens of tool messages as the chat template writes them after a finished assistant turn, ending
    with the prompt for the next assistant turn: the template's text for anchor+tools minus that for the
    anchor alone (so a default system prompt the template would add is not repeated)."""
    messages = [{"role": "tool", "content": c} for c in contents]
    base = tokenizer.apply_chat_template(_ANCHOR, tokenize=False)
    full = tokenizer.apply_chat_template(_ANCHOR + messages, add_generation_prompt=True, tokenize=False)
    if not full.startswith(base):
        raise ValueError("the tokenizer's chat template does not render tool messages after the conversation "
                         "without changing it; multi-turn tool rollouts need a template that appends them")
    return tokenizer.encode(full[len(base):], add_special_tokens=False)


def _error(text: str):
    logger.warning(text)
    return ToolResponse(text=text), 0.0, {}


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    def __init__(self, rollout_config, tokenizer, tools: dict, response_length: int):
        super().__init__(rollout_config, tokenizer, tools, response_length)
        mt = rollout_config.multi_turn
        self.max_assistant_turns = mt.get("max_assistant_turns")
        self.max_user_turns = mt.get("max_user_turns")
        self.max_parallel_calls = int(mt.get("max_parallel_calls", 1))
        self.max_tool_response_length = int(mt.get("max_tool_response_length", 256))
        self.tool_response_truncate_side = mt.get("tool_response_truncate_side", "middle")
        self.parser = ToolParser.get_tool_parser(mt.get("format", "hermes"), tokenizer)
        self.tool_calls_made = 0
        self.tool_rewards: list[float] = []

    async def on_generated(self, token_ids: list[int], ended: bool) -> None:
        self._append(token_ids, model_made=True)
        self.assistant_turns += 1
        if not ended or self.remaining <= 0:
            self.done = True
            return
        if self.max_assistant_turns and self.assistant_turns >= self.max_assistant_turns:
            self.done = True
            return
        if self.max_user_turns and self.user_turns >= self.max_user_turns:
            self.done = True
            return
        schemas = [t.tool_schema for t in self.tools.values() if getattr(t, "tool_schema", None) is not None]
        _, calls = await self.parser.extract_tool_calls(list(token_ids), tools=schemas)
        if not calls:
            self.done = True
            return
        calls = calls[: self.max_parallel_calls]
        tools_kwargs = self.kwargs.get("tools_kwargs") or {}
        results = await asyncio.gather(*(self._call_tool(call, tools_kwargs) for call in calls))
        self.tool_calls_made += len(results)
        self.tool_rewards.extend(float(reward) for _, reward, _ in results)
        texts = [response.text or "" for response, _, _ in results]
        self._append(tool_message_ids(self.tokenizer, texts), model_made=False)
        self.user_turns += 1
        if self.remaining <= 0:
            self.done = True

    async def _call_tool(self, tool_call: FunctionCall, tools_kwargs: dict, agent_data=None):
        """(ToolResponse with the truncated text, reward, metrics) for one call. A call the tool cannot serve
        (unknown name, arguments that are not JSON, the tool raising) answers with an error text naming the
        tool and reward 0, as the model would see from a real service, so one bad call never ends the batch."""
        tool = self.tools.get(tool_call.name)
        if tool is None:
            return _error(f"Unknown function {tool_call.name!r}; available tools: {sorted(self.tools)}")
        try:
            arguments = json.loads(tool_call.arguments)
        except (json.JSONDecodeError, TypeError) as err:
            return _error(f"Invalid JSON in the arguments of {tool_call.name!r}: {err}")
        try:
            if isinstance(tool, FunctionTool):   # stateless: called with the arguments alone
                response, reward, metrics = normalize_function_tool_return(await tool.call(arguments))
            else:
                row_kwargs = (tools_kwargs or {}).get(tool_call.name, {}) or {}
                instance_id, _ = await tool.create(create_kwargs=row_kwargs.get("create_kwargs", {}) or {})
                try:
                    response, reward, metrics = await tool.execute(instance_id, arguments,
                                                                   **(row_kwargs.get("execute_kwargs") or {}))
                finally:
                    await tool.release(instance_id, **(row_kwargs.get("release_kwargs") or {}))
        except Exception as err:  # noqa: BLE001 - the model sees the failure as the tool's answer
            logger.warning("tool %r failed: %r", tool_call.name, err)
            return _error(f"Error executing tool {tool_call.name!r}: {err}")
        text = response.text if hasattr(response, "text") else str(response)
        media = {k: getattr(response, k) for k in ("image", "video") if getattr(response, k, None) is not None}
        text = truncate_tool_response(text or "", self.max_tool_response_length, self.tool_response_truncate_side)
        return ToolResponse(text=text, **media), float(reward), metrics or {}

    def output(self):
        out = super().output()
        out.metrics = {"tool_calls": self.tool_calls_made, "tool_reward": sum(self.tool_rewards)}
        return out
