"""Builds tools from a tools config file (`class_name`, `config.type: native`, optional `tool_schema`) and
merges them with function tools, refusing duplicate names."""
from __future__ import annotations

import importlib
from enum import Enum
from typing import Optional

from verl.tools.function_tool import FunctionTool, load_function_tools_from_path
from verl.tools.schemas import OpenAIFunctionToolSchema

__all__ = ["ToolType", "get_tool_class", "initialize_tools_from_config", "load_all_tools"]


class ToolType(Enum):
    NATIVE = "native"


def get_tool_class(cls_name: str):
    """The class `package.module.Class` names."""
    module_name, class_name = cls_name.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), class_name)


def initialize_tools_from_config(tools_config_file) -> list:
    """One tool instance per entry of the file's `tools` list."""
    from omegaconf import OmegaConf

    tools = []
    for entry in OmegaConf.load(tools_config_file).tools:
        kind = ToolType(entry.config.type)
        if kind is not ToolType.NATIVE:
            raise NotImplementedError(f"Unsupported tool type: {kind}")
        schema = entry.get("tool_schema")
        schema = None if schema is None else OpenAIFunctionToolSchema.model_validate(
            OmegaConf.to_container(schema, resolve=True))
        tools.append(get_tool_class(entry.class_name)(config=OmegaConf.to_container(entry.config, resolve=True),
                                                       tool_schema=schema))
    return tools


def load_all_tools(tool_config_path: Optional[str], function_tool_path: Optional[str]) -> list:
    """Config-file tools followed by function tools; a name both define is an error."""
    native = initialize_tools_from_config(tool_config_path) if tool_config_path else []
    functions: list[FunctionTool] = load_function_tools_from_path(function_tool_path) if function_tool_path else []
    clash = sorted({t.name for t in native} & {t.name for t in functions})
    if clash:
        raise ValueError(f"Function tool name(s) {clash} collide with tools declared in '{tool_config_path}'; each "
                         "tool name must be unique across tool_config_path and function_tool_path")
    return native + functions
