"""The qwen3_coder (XML) and gpt-oss (harmony) tool-call formats: calls found, arguments typed by the tool's
schema, model text never evaluated, cut-off calls handled."""
import asyncio
import json

from verl.experimental.agent_loop.tool_parser import GptOssToolParser, Qwen3XMLToolParser, ToolParser
from verl.tools.schemas import (
    OpenAIFunctionParametersSchema,
    OpenAIFunctionPropertySchema,
    OpenAIFunctionSchema,
    OpenAIFunctionToolSchema,
)


class _TextTokenizer:
    """Stands in for a tokenizer whose ids are the characters of the text."""

    pad_token = "<pad>"

    def decode(self, ids, skip_special_tokens=False):
        return "".join(map(chr, ids))


def _ids(text):
    return [ord(c) for c in text]


def _schema(**types):
    props = {k: OpenAIFunctionPropertySchema(type=t) for k, t in types.items()}
    return OpenAIFunctionToolSchema(type="function", function=OpenAIFunctionSchema(
        name="calc", description="d", parameters=OpenAIFunctionParametersSchema(type="object", properties=props,
                                                                                required=[])))


def test_formats_are_registered_under_upstreams_names():
    assert isinstance(ToolParser.get_tool_parser("qwen3_coder", None), Qwen3XMLToolParser)
    assert isinstance(ToolParser.get_tool_parser("gpt-oss", None), GptOssToolParser)


def test_qwen3_xml_calls_are_typed_by_the_schema():
    text = ("Let me add.<tool_call>\n<function=calc>\n<parameter=a>\n7\n</parameter>\n<parameter=b>2.5</parameter>"
            "<parameter=exact>True</parameter><parameter=items>[1, 'x']</parameter><parameter=note>null</parameter>"
            "<parameter=opts>{\"k\": 1}</parameter></function>\n</tool_call>")
    tools = [_schema(a="integer", b="number", exact="boolean", items="array", note="string", opts="object")]
    content, calls = asyncio.run(Qwen3XMLToolParser(_TextTokenizer()).extract_tool_calls(_ids(text), tools=tools))
    assert content == "Let me add."
    assert [c.name for c in calls] == ["calc"]
    assert json.loads(calls[0].arguments) == {"a": 7, "b": 2.5, "exact": True, "items": [1, "x"], "note": None,
                                              "opts": {"k": 1}}


def test_qwen3_xml_values_that_do_not_fit_stay_text_and_are_not_evaluated():
    parser = Qwen3XMLToolParser(None)
    call = parser._parse_xml_function_call("calc><parameter=a>seven</parameter><parameter=items>"
                                           "__import__('os').getcwd()</parameter>", [_schema(a="int", items="list")])
    assert json.loads(call.arguments) == {"a": "seven", "items": "__import__('os').getcwd()"}


def test_qwen3_xml_two_calls_and_a_call_cut_off_by_the_length_limit():
    text = ("<tool_call><function=calc><parameter=a>1</parameter></function></tool_call>"
            "<tool_call><function=calc><parameter=a>2</parameter><parameter=b>3")
    content, calls = Qwen3XMLToolParser(None).parse_text(text, [_schema(a="integer", b="integer")])
    assert content == ""
    assert [json.loads(c.arguments) for c in calls] == [{"a": 1}, {"a": 2, "b": 3}]
    assert Qwen3XMLToolParser(None).parse_text("no calls here") == ("no calls here", [])


def test_gpt_oss_calls_outside_the_reasoning_channel():
    text = ("<|channel|>analysis<|message|>maybe to=functions.wrong <|constrain|>json<|message|>{}<|call|><|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            '{"city": "Tokyo"}<|call|><pad><pad>')
    content, calls = asyncio.run(GptOssToolParser(_TextTokenizer()).extract_tool_calls(_ids(text)))
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Tokyo"}')]
    assert "get_weather" not in content and "<pad>" not in content
    assert GptOssToolParser(_TextTokenizer()).parse_text("plain answer") == ("plain answer", [])
