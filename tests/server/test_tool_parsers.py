"""Tool-call formats and reasoning splits (server/tool_parsers.py, reasoning.py,
chat_output.py): a whole text's parts, and the same parts from the text streamed in pieces
cut at every awkward point (inside markers, names, escapes, multi-byte characters)."""

import json
import random

import pytest
from llguidance import LLMatcher

from vtllm.server.chat_output import ChatOutput, finish_reason
from vtllm.server.reasoning import ReasoningParser
from vtllm.server.tool_parsers import PARSERS, detect, held

CALLS = [("get_weather", {"city": 'Pa"ris \\ é', "days": [1, 2]}), ("now", {})]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
]


def _streamed(output: ChatOutput, text: str, cuts: list[int]):
    """(reasoning, content, [(id, name, arguments)]) of `text` fed in pieces at `cuts`."""
    reasoning, content, calls = "", "", {}
    bounds = [0, *cuts, len(text)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        parts = output.feed(text[a:b], b == len(text))
        reasoning += parts.reasoning or ""
        content += parts.content or ""
        for d in parts.tool_calls:
            if d.id is not None:
                assert d.index == len(calls) and d.function.arguments == ""
                calls[d.index] = [d.id, d.function.name, ""]
            else:
                calls[d.index][2] += d.function.arguments
    return reasoning, content, [tuple(c[1:]) for c in calls.values()]


def _whole(output: ChatOutput, text: str):
    parts = output.whole(text)
    calls = [(c.function.name, c.function.arguments) for c in parts.tool_calls]
    return parts.reasoning or "", parts.content or "", calls


def _every_way(make, text: str):
    """The whole parts, checked equal to those of the text streamed in many cuttings."""
    expected = _whole(make(), text)
    cuttings = [[i] for i in range(1, len(text))]  # two pieces, cut anywhere
    cuttings.append(list(range(1, len(text))))  # one character a piece
    rng = random.Random(0)
    for _ in range(20):
        cuttings.append(sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 6))))
    for cuts in cuttings:
        assert _streamed(make(), text, cuts) == expected, cuts
    return expected


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_written_calls_read_back_whole_and_streamed(name):
    parser = PARSERS[name]
    text = parser.write(CALLS)
    reasoning, content, calls = _every_way(lambda: ChatOutput(None, parser), text)
    assert reasoning == "" and content.strip() == ""
    assert [(n, json.loads(a)) for n, a in calls] == CALLS


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_one_call_only_when_not_parallel(name):
    parser = PARSERS[name]
    text = parser.write(CALLS)
    _, _, calls = _every_way(lambda: ChatOutput(None, parser, parallel=False), text)
    assert [n for n, _ in calls] == ["get_weather"]


@pytest.mark.parametrize("name", ["hermes", "mistral"])
def test_content_before_the_calls_is_content(name):
    parser = PARSERS[name]
    text = "Let me look that up. " + parser.write(CALLS[:1])
    _, content, calls = _every_way(lambda: ChatOutput(None, parser), text)
    assert content == "Let me look that up. " and calls[0][0] == "get_weather"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", "a < b, and <tool_ is not a tag <tool_cal"),
        ("hermes", "x <tool_call>\n{not json}\n</tool_call>"),
        ("llama3_json", "The answer is 4."),
        ("llama3_json", '{"answer": 4}'),  # JSON, but no call
        ("mistral", "[TOOL_CALLS] not a list"),
        ("mistral", "plain [TOOL_CALL"),
    ],
)
def test_text_that_is_no_call_is_content(name, text):
    """Never dropped: what does not parse as calls comes back as the text it was."""
    make = lambda: ChatOutput(None, PARSERS[name])  # noqa: E731
    assert _whole(make(), text) == ("", text, [])
    assert _streamed(make(), text, list(range(1, len(text)))) == ("", text, [])


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1'),  # cut by max_tokens
        ("hermes", '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'),
        ("llama3_json", '  {"name": "f", "parameters": {"a": '),
    ],
)
def test_a_broken_call_is_content_whole_but_stays_announced_in_a_stream(name, text):
    """A stream cannot take back a call whose name it sent (vLLM's streams neither)."""
    make = lambda: ChatOutput(None, PARSERS[name])  # noqa: E731
    assert _whole(make(), text) == ("", text, [])
    _, content, calls = _streamed(make(), text, list(range(1, len(text))))
    assert [n for n, _ in calls] == ["f"] and content == ""


def test_calls_without_arguments_get_an_empty_object():
    text = '<tool_call>\n{"name": "now"}\n</tool_call>'
    assert _every_way(lambda: ChatOutput(None, PARSERS["hermes"]), text)[2] == [("now", "{}")]
    text = '{"name": "now"}; {"name": "get_weather", "parameters": {"city": "x"}}'
    calls = _every_way(lambda: ChatOutput(None, PARSERS["llama3_json"]), text)[2]
    assert calls == [("now", "{}"), ("get_weather", '{"city": "x"}')]


def test_llama3_python_tag_and_leading_space():
    text = ' <|python_tag|>{"name": "now", "parameters": {}}'
    assert _every_way(lambda: ChatOutput(None, PARSERS["llama3_json"]), text)[2] == [("now", "{}")]


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize("parallel", [True, False])
def test_grammars_compile(name, parallel):
    grammar = LLMatcher.grammar_from_lark(PARSERS[name].grammar(TOOLS, parallel))
    assert LLMatcher.validate_grammar(grammar) == ""


def test_format_detected_from_the_template():
    assert detect(None) == "hermes" and detect("{{ messages }}") == "hermes"
    assert detect("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert detect("[TOOL_CALLS] {{ tools }}") == "mistral"
    assert detect("<|python_tag|>{{ tools }}") == "llama3_json"


def test_held_keeps_back_a_marker_beginning():
    assert held("abc <tool_c", "<tool_call>") == "abc "
    assert held("abc <", "<tool_call>") == "abc "
    assert held("abc", "<tool_call>") == "abc"
    assert held("<tool_call>", "<tool_call>") == "<tool_call>"  # whole: the parser's to see


def test_finish_reason_of_a_call():
    assert finish_reason("stop", True) == "tool_calls"
    assert finish_reason("length", True) == "length"
    assert finish_reason("stop", False) == "stop"


THINK = "<think>\nLet me see: 2 + 2 </thin is not the end.\n</think>\n\nIt is 4."


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
def test_reasoning_split_whole_and_streamed(name):
    make = lambda: ChatOutput(ReasoningParser(name))  # noqa: E731
    reasoning, content, _ = _every_way(make, THINK)
    assert reasoning == "\nLet me see: 2 + 2 </thin is not the end.\n" and content == "It is 4."


def test_qwen3_without_think_is_content():
    make = lambda: ChatOutput(ReasoningParser("qwen3"))  # noqa: E731
    assert _every_way(make, "It is <th 4.") == ("", "It is <th 4.", [])
    parts = make().whole("It is 4.")
    assert parts.reasoning is None and parts.content == "It is 4."


def test_deepseek_r1_output_starts_inside_the_reasoning():
    """The template opened <think>: the output has only the end marker, or none yet."""
    make = lambda: ChatOutput(ReasoningParser("deepseek_r1"))  # noqa: E731
    assert _every_way(make, "2 + 2 is 4.</think>Four.") == ("2 + 2 is 4.", "Four.", [])
    assert _every_way(make, "still thinking </thi") == ("still thinking </thi", "", [])


def test_a_prompt_ending_in_think_opens_the_reasoning():
    parser = ReasoningParser.for_prompt("qwen3", "<|im_start|>assistant\n<think>\n")
    assert parser.opened_by_prompt
    assert _every_way(lambda: ChatOutput(parser), "hm</think>ok") == ("hm", "ok", [])
    assert not ReasoningParser.for_prompt("qwen3", "<think>\n\n</think>\n\n").opened_by_prompt


def test_reasoning_then_tool_calls():
    text = "<think>call it</think>\n" + PARSERS["hermes"].write(CALLS[:1])
    make = lambda: ChatOutput(ReasoningParser("qwen3"), PARSERS["hermes"])  # noqa: E731
    reasoning, content, calls = _every_way(make, text)
    assert reasoning == "call it" and content == "" and calls[0][0] == "get_weather"
