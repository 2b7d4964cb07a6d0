"""OpenAI-format tool schemas and tool responses (pydantic models, as upstream: `pip install pydantic`, which
transformers >= 5 already brings)."""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

__all__ = ["OpenAIFunctionPropertySchema", "OpenAIFunctionParametersSchema", "OpenAIFunctionSchema",
           "OpenAIFunctionToolSchema", "OpenAIFunctionParsedSchema", "OpenAIFunctionCallSchema",
           "OpenAIFunctionToolCall", "ToolResponse"]


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter: its JSON type (a list of types for a union), description and allowed values."""

    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    """A function's parameters: an object type, its properties and the required names."""

    type: str
    properties: dict[str, OpenAIFunctionPropertySchema]
    required: list[str] = Field(default_factory=list)


def _no_parameters() -> OpenAIFunctionParametersSchema:
    return OpenAIFunctionParametersSchema(type="object", properties={}, required=[])


class OpenAIFunctionSchema(BaseModel):
    """A function a model may call."""

    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=_no_parameters)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """A tool entry of an OpenAI `tools` list (`type` is "function")."""

    type: str
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A call as parsed from model output: the name and the arguments as JSON text."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A call with its arguments decoded."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(parsed_schema: OpenAIFunctionParsedSchema
                                           ) -> tuple["OpenAIFunctionCallSchema", bool]:
        """(call, had a decode error): arguments that are not a JSON object become {} and flag the error."""
        try:
            arguments = json.loads(parsed_schema.arguments)
        except json.JSONDecodeError:
            arguments = None
        bad = not isinstance(arguments, dict)
        return OpenAIFunctionCallSchema(name=parsed_schema.name, arguments={} if bad else arguments), bad


class OpenAIFunctionToolCall(BaseModel):
    """A tool call with its id, as a chat message carries it."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """What a tool returns to the conversation: text, and lists of images and videos."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _media_are_lists(cls, values):
        if isinstance(values, dict):
            for key in ("image", "video"):
                if key in values and not isinstance(values[key], list):
                    raise ValueError(f"ToolResponse.{key} must be a list, got {type(values[key]).__name__}; "
                                     f"wrap a single {key} in a list: {{'{key}': [item]}}")
        return values

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        return bool(self.text) and not self.image and not self.video
