"""Request fields -> the engine's parameters, without a server: response_format,
structured_outputs and guided_* -> StructuredOutputs naming their field; tools, tool_choice and
the tool turns of the history -> what the chat template gets and the tool grammar;
chat_template_kwargs; the two parser knobs."""

import json

import msgspec
import pytest

from vtllm.config import resolve
from vtllm.errors import InvalidParameter
from vtllm.models.chat_template import render_chat, template_variables
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.server.chat_setup import ChatSetup, tool_parser
from vtllm.server.protocol import chat_decoder, completion_decoder
from vtllm.server.structured import WHITESPACE, structured_outputs
from vtllm.server.tool_parsers import PARSERS
from vtllm.server.tools import for_template, template_kwargs, tool_request
from vtllm.server.validate import chat_messages

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
BOUNDED = {**SCHEMA, "x-guidance": WHITESPACE}  # what the engine gets (structured.bounded)
ANY_OBJECT = {"type": "object", "x-guidance": WHITESPACE}
TOOL = {"type": "function", "function": {"name": "get", "parameters": SCHEMA}}
MSG = [{"role": "user", "content": "hi"}]


def _chat(**fields):
    return chat_decoder.decode(msgspec.json.encode({"messages": MSG, **fields}))[0]


def _completion(**fields):
    return completion_decoder.decode(msgspec.json.encode({"prompt": "x", **fields}))[0]


@pytest.mark.parametrize(
    ("fields", "kind", "value", "field"),
    [
        ({"response_format": {"type": "json_object"}}, "json", ANY_OBJECT, "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "p", "schema": SCHEMA, "strict": True},
                }
            },  # noqa: E501
            "json",
            BOUNDED,
            "response_format",
        ),
        ({"structured_outputs": {"regex": "[0-9]+"}}, "regex", "[0-9]+", "structured_outputs"),
        (
            {"structured_outputs": {"choice": ["a", "b"]}},
            "choice",
            ["a", "b"],
            "structured_outputs",
        ),
        ({"structured_outputs": {"json": SCHEMA}}, "json", BOUNDED, "structured_outputs"),
        (
            {"structured_outputs": {"grammar": 'start: "a"'}},
            "grammar",
            'start: "a"',
            "structured_outputs",
        ),  # noqa: E501
        ({"structured_outputs": {"json_object": True}}, "json", ANY_OBJECT, "structured_outputs"),
        ({"guided_json": SCHEMA}, "json", BOUNDED, "guided_json"),
        ({"guided_json": json.dumps(SCHEMA)}, "json", BOUNDED, "guided_json"),
        ({"guided_json": "{not json"}, "json", "{not json", "guided_json"),  # the engine's 400
        ({"guided_json": {"x-guidance": {}}}, "json", {"x-guidance": {}}, "guided_json"),
        ({"guided_regex": "a|b"}, "regex", "a|b", "guided_regex"),
        ({"guided_choice": ["yes", "no"]}, "choice", ["yes", "no"], "guided_choice"),
        ({"guided_grammar": 'root ::= "a"'}, "grammar", 'root ::= "a"', "guided_grammar"),
    ],
)
@pytest.mark.parametrize("make", [_chat, _completion])
def test_each_field_maps_to_one_constraint(make, fields, kind, value, field):
    so = structured_outputs(make(**fields, guided_decoding_backend="auto"))
    assert getattr(so, kind) == value and so.field == field


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"response_format": {"type": "text"}},
        {"response_format": None, "guided_json": None, "structured_outputs": None},
        {"guided_decoding_backend": "llguidance", "guided_whitespace_pattern": None},
    ],
)
def test_values_asking_for_nothing_map_to_none(fields):
    assert structured_outputs(_chat(**fields)) is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "sound"}}, "response_format.type"),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            "response_format.json_schema.name",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
        ),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"backend": "x"}}, "structured_outputs.backend"),
        ({"structured_outputs": [1]}, "structured_outputs"),
        ({"guided_json": 5}, "guided_json"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["a", 1]}, "guided_choice"),
        ({"guided_grammar": ["x"]}, "guided_grammar"),
        ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
        ({"guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
        # two constraints at once: the second one is named
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
        ({"guided_json": SCHEMA, "guided_choice": ["a"]}, "guided_choice"),
        ({"structured_outputs": {"regex": "a"}, "guided_grammar": "x"}, "guided_grammar"),
    ],
)
def test_bad_values_are_refused_naming_the_field(fields, param):
    with pytest.raises(InvalidParameter) as info:
        structured_outputs(_chat(**fields))
    assert info.value.param == param


def test_tool_request_defaults_and_choices():
    assert (
        tool_request(_chat()) is None and tool_request(_chat(tools=[], tool_choice="none")) is None
    )
    tools = tool_request(_chat(tools=[TOOL]))
    assert tools.choice == "auto" and tools.parallel and tools.parses
    assert tools.tools[0]["function"] == {"name": "get", "parameters": SCHEMA}
    assert tool_request(_chat(tools=[TOOL], tool_choice="none")).parses is False
    assert not tool_request(_chat(tools=[TOOL], parallel_tool_calls=False)).parallel
    named = tool_request(
        _chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get"}})
    )
    assert named.choice == "named" and named.named == "get"
    bare = {"type": "function", "function": {"name": "now"}}  # parameters may be left out
    assert tool_request(_chat(tools=[bare])).tools[0]["function"]["parameters"]["type"] == "object"


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_required_and_named_choices_constrain_with_a_grammar(parser):
    fmt = PARSERS[parser]
    other = {"type": "function", "function": {"name": "other", "parameters": SCHEMA}}
    required = tool_request(_chat(tools=[TOOL, other], tool_choice="required")).grammar(fmt)
    assert required.field == "tool_choice" and "get" in required.grammar
    assert "other" in required.grammar
    choice = {"type": "function", "function": {"name": "other"}}
    named = tool_request(_chat(tools=[TOOL, other], tool_choice=choice)).grammar(fmt)
    assert '"other"' in named.grammar and '"get"' not in named.grammar
    assert tool_request(_chat(tools=[TOOL])).grammar(fmt) is None  # auto: free text


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tool_choice": {"type": "function", "function": {"name": "get"}}}, "tool_choice"),
        ({"tools": TOOL}, "tools"),
        ({"tools": [TOOL] * 129}, "tools"),
        ({"tools": [{"type": "code", "function": TOOL["function"]}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": 1}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "objectx"}},
                    }
                ]
            },  # noqa: E501
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice.function.name",
        ),  # noqa: E501
        ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice.function"),
    ],
)
def test_bad_tools_are_refused_naming_the_field(fields, param):
    with pytest.raises(InvalidParameter) as info:
        tool_request(_chat(**fields))
    assert info.value.param == param


def test_two_constraints_from_tools_and_response_format_are_refused():
    req = _chat(tools=[TOOL], tool_choice="required", response_format={"type": "json_object"})
    setup = ChatSetup.of(req, MSG, resolve(env={})[0], None)
    with pytest.raises(InvalidParameter) as info:
        setup.constrain(req, SamplingParams())
    assert info.value.param == "response_format"


HISTORY = [
    {"role": "user", "content": "weather?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get", "arguments": '{"a": 1}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


def test_tool_turns_of_the_history_are_checked_and_kept():
    messages = chat_messages(_chat(messages=HISTORY), 10_000)
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert messages[1]["content"] == "" and messages[2]["tool_call_id"] == "call_1"
    for bad, param in [
        ({**HISTORY[2], "tool_call_id": None}, "messages[0].tool_call_id"),
        ({**HISTORY[1], "tool_calls": [{"id": "c"}]}, "messages[0].tool_calls[0]"),
        (
            {**HISTORY[1], "tool_calls": [{"function": {"name": "f", "arguments": "[1"}}]},
            "messages[0].tool_calls[0].function",
        ),  # noqa: E501
        (
            {"role": "user", "content": "x", "tool_calls": HISTORY[1]["tool_calls"]},
            "messages[0].tool_calls",
        ),  # noqa: E501
        ({"role": "function", "content": "x"}, "messages[0].role"),
        (
            {"role": "assistant", "content": "x", "function_call": {"name": "f"}},
            "messages[0].function_call",
        ),  # noqa: E501
    ]:
        with pytest.raises(InvalidParameter) as info:
            chat_messages(_chat(messages=[bad]), 10_000)
        assert info.value.param == param, bad


def test_a_template_without_tools_gets_a_preamble_and_written_calls():
    tools = tool_request(_chat(tools=[TOOL]))
    messages = chat_messages(_chat(messages=HISTORY), 10_000)
    shown, template_tools = for_template(messages, tools, PARSERS["hermes"], knows_tools=False)
    assert template_tools is None and shown[0]["role"] == "system"
    assert '"name": "get"' in shown[0]["content"] and "<tool_call>" in shown[0]["content"]
    assert shown[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get", "arguments": {"a": 1}}\n</tool_call>',
    }
    assert shown[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}
    # a system turn of the request keeps its words, the preamble follows them
    with_system = [{"role": "system", "content": "Be brief."}, *messages]
    shown, _ = for_template(with_system, tools, PARSERS["hermes"], knows_tools=False)
    assert shown[0]["content"].startswith("Be brief.\n\n") and len(shown) == 4


def test_a_template_that_knows_tools_gets_them_as_hf_passes_them():
    template = (
        "{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %};"
        "{% endfor %}{{ enable_thinking }}"
    )
    assert "tools" in template_variables(template)
    tools = tool_request(_chat(tools=[TOOL]))
    messages = chat_messages(_chat(messages=HISTORY), 10_000)
    shown, template_tools = for_template(messages, tools, PARSERS["hermes"], knows_tools=True)
    text = render_chat(template, shown, tools=template_tools, extra={"enable_thinking": False})
    assert text == '[get]user:weather?;assistant:{"a": 1};tool:sunny;False'


def test_chat_template_kwargs():
    assert template_kwargs(_chat()) == {} and template_kwargs(_chat(chat_template_kwargs={})) == {}
    assert template_kwargs(_chat(chat_template_kwargs={"enable_thinking": True})) == {
        "enable_thinking": True
    }
    for bad in ([1], {"messages": []}, {"tools": 1}, {"not a name": 1}):
        with pytest.raises(InvalidParameter) as info:
            template_kwargs(_chat(chat_template_kwargs=bad))
        assert info.value.param == "chat_template_kwargs"


def test_parser_knobs():
    config, sources = resolve(
        env={"VT_TOOL_CALL_PARSER": "mistral", "VT_REASONING_PARSER": "qwen3"}
    )
    assert config.tool_call_parser == "mistral" and config.reasoning_parser == "qwen3"
    assert sources["tool_call_parser"] == "env"
    assert tool_parser(config, "<tool_call>").name == "mistral"  # named: no detection
    auto = resolve(env={})[0]
    assert auto.tool_call_parser == "auto" and auto.reasoning_parser is None
    assert tool_parser(auto, "[TOOL_CALLS]{{ tools }}").name == "mistral"
    with pytest.raises(InvalidParameter):
        resolve(env={"VT_REASONING_PARSER": "r2"})
