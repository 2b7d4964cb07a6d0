"""Tool-call parsers: find the calls in a model turn. `format` (rollout.multi_turn.format) names one;
`hermes` (Qwen's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) is upstream's default."""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

__all__ = ["FunctionCall", "HermesToolParser", "ToolParser"]

logger = logging.getLogger(__name__)


@dataclass
class FunctionCall:
    """One parsed call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


class ToolParser:
    """Base of the parsers; subclasses register under a format name."""

    _registry: dict[str, type["ToolParser"]] = {}

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def register(cls, name: str):
        def wrap(parser_cls):
            cls._registry[name] = parser_cls
            return parser_cls
        return wrap

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer) -> "ToolParser":
        if name not in cls._registry:
            raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format={name!r} is not a tool-call format this "
                             f"verl parses; use one of {sorted(cls._registry)}")
        return cls._registry[name](tokenizer)

    async def extract_tool_calls(self, responses_ids: list[int]) -> tuple[str, list[FunctionCall]]:
        """(the turn's text without its calls, the calls in order)."""
        raise NotImplementedError


@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    """Calls written as `<tool_call>` JSON `</tool_call>`; a block that is not a JSON object with a string
    `name` is skipped (the model sees no response for it)."""

    START, END = "<tool_call>", "</tool_call>"
    _block = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse_text(self, text: str) -> tuple[str, list[FunctionCall]]:
        if self.START not in text or self.END not in text:
            return text, []
        calls = []
        for body in self._block.findall(text):
            try:
                call = json.loads(body)
            except json.JSONDecodeError:
                logger.warning("skipping a tool call that is not JSON: %r", body[:200])
                continue
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                logger.warning("skipping a tool call without a name: %r", body[:200])
                continue
            calls.append(FunctionCall(name=call["name"], arguments=json.dumps(call.get("arguments", {}),
                                                                              ensure_ascii=False)))
        return self._block.sub("", text), calls

    async def extract_tool_calls(self, responses_ids: list[int]) -> tuple[str, list[FunctionCall]]:
        return self.parse_text(self.tokenizer.decode(responses_ids, skip_special_tokens=False))
