"""Plain Python functions as tools: `@function_tool` registers one (its OpenAI schema read from the signature
and Google-style docstring by transformers' `get_json_schema`), and a file of them loads by path."""
from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["FUNCTION_TOOL_REGISTRY", "FunctionTool", "function_tool", "get_function_tool",
           "load_function_tools_from_path", "normalize_function_tool_return"]

logger = logging.getLogger(__name__)

FUNCTION_TOOL_REGISTRY: dict[str, "FunctionTool"] = {}
_LOADED_FUNCTION_TOOL_PATHS: dict[str, list["FunctionTool"]] = {}


@dataclass
class FunctionTool:
    """A registered function: its tool name, the callable, its schema, and whether it is a coroutine."""

    name: str
    fn: Callable[..., Any]
    tool_schema: OpenAIFunctionToolSchema
    is_async: bool = False

    async def call(self, parameters: dict[str, Any]) -> Any:
        """Call with the model's arguments (a plain function runs in a worker thread)."""
        if self.is_async:
            return await self.fn(**parameters)
        return await asyncio.to_thread(self.fn, **parameters)


def _schema_for(fn: Callable, tool_name: str) -> OpenAIFunctionToolSchema:
    variadic = [name for name, p in inspect.signature(fn).parameters.items()
                if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if variadic:
        raise ValueError(f"@function_tool '{tool_name}' declares variadic parameter(s) {variadic}, which an OpenAI "
                         "tool schema cannot describe; use named parameters")
    from transformers.utils import get_json_schema

    raw = get_json_schema(fn)
    raw["function"]["name"] = tool_name
    return OpenAIFunctionToolSchema.model_validate(raw)


def function_tool(name: Optional[str | Callable] = None, *, schema: Optional[OpenAIFunctionToolSchema | dict] = None):
    """Register a function as a tool: `@function_tool`, `@function_tool("name")` or with an explicit `schema`.
    Registering another function under a taken name is an error; the decorated function is returned unchanged."""

    def register(fn: Callable, tool_name: Optional[str]):
        tool_name = tool_name or fn.__name__
        if isinstance(schema, dict):
            built = OpenAIFunctionToolSchema.model_validate(schema)
        else:
            built = schema if schema is not None else _schema_for(fn, tool_name)
        taken = FUNCTION_TOOL_REGISTRY.get(tool_name)
        if taken is not None and taken.fn is not fn:
            raise ValueError(f"Function tool '{tool_name}' is already registered to "
                             f"{taken.fn.__module__}.{taken.fn.__qualname__}; rename one of them")
        FUNCTION_TOOL_REGISTRY[tool_name] = FunctionTool(tool_name, fn, built, inspect.iscoroutinefunction(fn))
        return fn

    if callable(name) and schema is None:
        return register(name, None)
    return lambda fn: register(fn, name)


def get_function_tool(name: str) -> FunctionTool:
    if name not in FUNCTION_TOOL_REGISTRY:
        raise KeyError(f"Function tool '{name}' not found in registry; reference the file that defines it with the "
                       "rollout's function_tool_path")
    return FUNCTION_TOOL_REGISTRY[name]


def load_function_tools_from_path(path: str) -> list[FunctionTool]:
    """Execute the Python file at `path` (once per path) and return the tools it registered."""
    abs_path = os.path.abspath(path)
    if not os.path.isfile(abs_path):
        raise FileNotFoundError(f"function_tool_path does not exist: {path}")
    if abs_path in _LOADED_FUNCTION_TOOL_PATHS:
        return _LOADED_FUNCTION_TOOL_PATHS[abs_path]
    before = set(FUNCTION_TOOL_REGISTRY)
    module_name = "_verl_function_tools_" + abs_path.replace(os.sep, "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(module_name, abs_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import function_tool_path {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    tools = [FUNCTION_TOOL_REGISTRY[n] for n in sorted(set(FUNCTION_TOOL_REGISTRY) - before)]
    if not tools:
        logger.warning("function_tool_path %s loaded but no @function_tool decorators found; decorate the tool "
                       "functions with @function_tool", path)
    _LOADED_FUNCTION_TOOL_PATHS[abs_path] = tools
    return tools


def _as_response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return ToolResponse(text=value if isinstance(value, str) else str(value))


def normalize_function_tool_return(ret: Any) -> tuple[ToolResponse, float, dict]:
    """(response, reward, metrics) from what a function returned: a response, text, a dict (as JSON text), or a
    tuple of one to three of (response, reward, metrics) where None reward / metrics mean 0.0 / {}."""
    if isinstance(ret, tuple):
        if not 1 <= len(ret) <= 3:
            raise TypeError(f"@function_tool return tuple must have length 1, 2, or 3 (got {len(ret)}: {ret!r})")
        reward = 0.0 if len(ret) < 2 or ret[1] is None else float(ret[1])
        metrics = {} if len(ret) < 3 or ret[2] is None else dict(ret[2])
        return _as_response(ret[0]), reward, metrics
    return _as_response(ret), 0.0, {}
