"""Tool-call parsers: find the calls in a model turn. `format` (rollout.multi_turn.format) names one:
`hermes` (Qwen's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, upstream's default), `qwen3_coder`
(Qwen3-Coder's XML calls) or `gpt-oss` (the harmony format's `to=functions.NAME` messages)."""
from __future__ import annotations

import ast
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["FunctionCall", "GptOssToolParser", "HermesToolParser", "Qwen3XMLToolParser", "ToolParser"]

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

    async def extract_tool_calls(self, responses_ids: list[int], tools=None) -> tuple[str, list[FunctionCall]]:
        """(the turn's text without its calls, the calls in order). `tools` (OpenAI tool schemas) lets a
        format whose arguments are untyped text convert them to the declared types."""
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

    async def extract_tool_calls(self, responses_ids: list[int], tools=None) -> tuple[str, list[FunctionCall]]:
        return self.parse_text(self.tokenizer.decode(responses_ids, skip_special_tokens=False))


def _declared_types(tools, name: str) -> dict[str, str] | None:
    """Parameter name -> declared JSON-schema type of tool `name`; None when no schema names the tool."""
    for tool in tools or ():
        function = getattr(tool, "function", None)
        if getattr(tool, "type", "function") == "function" and function is not None and function.name == name:
            properties = function.parameters.properties if function.parameters else {}
            return {key: str(getattr(prop, "type", "string") or "string").strip().lower()
                    for key, prop in properties.items()}
    return None


def _convert_xml_value(text: str, kind: str | None) -> Any:
    """A parameter's text as its declared type; text that does not fit the type is kept as the string.
    Structured values are read with json or ast.literal_eval only (the text is model output: never eval'd)."""
    if text.lower() == "null":
        return None
    if kind is None or kind in ("string", "str", "text", "varchar", "char", "enum"):
        return text
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(text)
        except ValueError:
            return text
    if kind.startswith(("num", "float")):
        try:
            number = float(text)
        except ValueError:
            return text
        return int(number) if number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return text.lower() == "true"
    if kind == "object" or kind.startswith("dict"):
        try:
            return json.loads(text)
        except ValueError:
            pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


@ToolParser.register("qwen3_coder")
class Qwen3XMLToolParser(ToolParser):
    """Qwen3-Coder / Qwen3.5 calls: `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function>
    </tool_call>`. Values are text, converted to the types the tool's schema declares. A block cut off by the
    response limit still yields the parameters that closed; a parameter without its `>` is dropped."""

    START = "<tool_call>"
    _calls = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
    _functions = re.compile(r"<function=(.*?)(?:</function>|$)", re.DOTALL)
    _parameters = re.compile(r"<parameter=(.*?)(?:</parameter>|$)", re.DOTALL)

    def _parse_xml_function_call(self, function_call_str: str, tools=None) -> FunctionCall | None:
        """One `NAME>` + parameters body (the text after `<function=`); None when the name has no `>`."""
        name, sep, body = function_call_str.partition(">")
        if not sep:
            logger.warning("skipping a tool call whose function header is cut off: %r", function_call_str[:200])
            return None
        types = _declared_types(tools, name)
        arguments = {}
        for chunk in self._parameters.findall(body):
            key, sep, value = chunk.partition(">")
            if not sep:
                logger.warning("skipping a parameter of %r whose header is cut off: %r", name, chunk[:200])
                continue
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            arguments[key] = _convert_xml_value(value, None if types is None else types.get(key, None))
        return FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))

    def parse_text(self, text: str, tools=None) -> tuple[str, list[FunctionCall]]:
        start = text.find(self.START)
        if start < 0:
            return text, []
        calls = []
        for block in self._calls.findall(text):
            for function in self._functions.findall(block):
                call = self._parse_xml_function_call(function, tools)
                if call is not None:
                    calls.append(call)
        return (text[:start], calls) if calls else (text, [])

    async def extract_tool_calls(self, responses_ids: list[int], tools=None) -> tuple[str, list[FunctionCall]]:
        return self.parse_text(self.tokenizer.decode(responses_ids), tools)


@ToolParser.register("gpt-oss")
class GptOssToolParser(ToolParser):
    """gpt-oss (harmony format) calls: an assistant message on a channel addressed `to=functions.NAME`, JSON
    constrained, ended by `<|call|>`. Reasoning (`analysis` channel) is dropped first, since it may quote
    call tokens; the arguments text is handed on as written."""

    _analysis = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>analysis<\|message\|>.*?<\|end\|>", re.DOTALL)
    _call = re.compile(r"<\|start\|>assistant<\|channel\|>[^<]* to=functions\.([^<]+?) "
                       r"<\|constrain\|>json<\|message\|>(.*?)<\|call\|>", re.DOTALL)

    def parse_text(self, text: str) -> tuple[str, list[FunctionCall]]:
        text = self._analysis.sub("", text)
        calls = [FunctionCall(name=name, arguments=arguments) for name, arguments in self._call.findall(text)]
        return self._call.sub("", text), calls

    async def extract_tool_calls(self, responses_ids: list[int], tools=None) -> tuple[str, list[FunctionCall]]:
        text = self.tokenizer.decode(responses_ids, skip_special_tokens=False)
        if self.tokenizer.pad_token:
            text = text.replace(self.tokenizer.pad_token, "")
        return self.parse_text(text)
