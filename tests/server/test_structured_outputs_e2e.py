"""Structured outputs and tool calling through the official openai client against a live
server with the default model (SmolLM2-135M: too small to follow instructions, so every
guarantee here comes from the grammar engine, which is the point).

Requests run side by side (threads) so the engine decodes them as one batch."""

import json
import signal
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pydantic
import pytest

from tests.server.conftest import start_server, wait_idle
from tests.server.schemas import SCHEMAS

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served():
    proc, base = start_server()
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    yield client, client.models.list().data[0].id, base
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


def _all(fn, items):
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=130)
    city: str = pydantic.Field(max_length=12)


def test_parse_with_a_pydantic_model_returns_the_object(served):
    client, model, _ = served
    out = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format=Person,
        max_tokens=96,
        temperature=0,
    )
    person = out.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 130


def test_json_schema_outputs_validate(served):
    client, model, base = served

    def ask(item):
        name, schema = item
        out = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Give a {name} as JSON."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            },
            max_tokens=160,
            temperature=0.7,
            seed=1,
        )
        return name, schema, out.choices[0]

    assert len(SCHEMAS) == 20
    for name, schema, choice in _all(ask, list(SCHEMAS.items())):
        assert choice.finish_reason == "stop", (name, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)
    wait_idle(base)


def test_json_object_and_guided_json_on_completions(served):
    client, model, _ = served
    out = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Any JSON object, please."}],
        response_format={"type": "json_object"},
        max_tokens=32,
        temperature=0,
        extra_body={"guided_decoding_backend": "auto"},
    )
    if out.choices[0].finish_reason == "stop":  # a free object may outgrow max_tokens
        assert isinstance(json.loads(out.choices[0].message.content), dict)
    schema = SCHEMAS["point"]
    out = client.completions.create(
        model=model, prompt="A point:", max_tokens=48, extra_body={"guided_json": schema}
    )
    jsonschema.validate(json.loads(out.choices[0].text), schema)


REGEX = r"[A-Z][a-z]{2,5}-[0-9]{2}"
COLOURS = ["red", "green", "blue", "dark violet"]


@pytest.mark.parametrize(
    ("extra", "check"),
    [
        ({"guided_regex": REGEX}, lambda t: __import__("re").fullmatch(REGEX, t)),
        ({"structured_outputs": {"choice": COLOURS}}, lambda t: t in COLOURS),
    ],
    ids=["regex", "choice"],
)
def test_sampled_outputs_hold_the_constraint(served, extra, check):
    """100 samples (two requests of 5 prompts x n=10) at temperature 1."""
    client, model, base = served

    def ask(seed):
        prompts = ["Name:", "Colour:", "x", "The answer is", "Tag"]
        return client.completions.create(
            model=model,
            prompt=prompts,
            n=10,
            max_tokens=16,
            temperature=1.0,
            seed=seed,
            extra_body=extra,
        ).choices

    choices = [c for batch in _all(ask, [1, 2]) for c in batch]
    assert len(choices) == 100
    assert all(c.finish_reason == "stop" and check(c.text) for c in choices), [
        c.text for c in choices if not check(c.text)
    ]
    wait_idle(base)


def _call_args(call, tool):
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"].get("parameters", {"type": "object"}))
    return args


def test_tool_choice_required_always_yields_a_valid_call(served):
    client, model, base = served
    out = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        parallel_tool_calls=False,
        n=12,
        temperature=1.0,
        seed=3,
        max_tokens=64,
    )
    tools = {"get_weather": WEATHER, "get_time": CLOCK}
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_") and call.type == "function"
        _call_args(call, tools[call.function.name])
    named = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=32,
        temperature=0,
    )
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments) == {}
    wait_idle(base)


def _streamed_message(stream):
    """content, calls [(id, name, arguments)] and finish reason, from a stream's deltas."""
    content, calls, reason = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or ():
            if d.id is not None:  # id, type and name come first, arguments after
                assert d.function.name and d.type == "function" and d.index == len(calls)
                calls[d.index] = [d.id, d.function.name, d.function.arguments or ""]
            else:
                assert d.function.name is None
                calls[d.index][2] += d.function.arguments
        reason = chunk.choices[0].finish_reason or reason
    return content, [tuple(c) for c in calls.values()], reason


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_calling_loop(served, stream):
    """call -> tool result -> final answer, the history carried as the client sends it."""
    client, model, base = served
    common = {
        "model": model,
        "tools": [WEATHER],
        "parallel_tool_calls": False,
        "max_tokens": 64,
        "temperature": 0,
    }
    first = client.chat.completions.create(
        messages=ASK, tool_choice="required", stream=stream, **common
    )
    if stream:
        _, calls, reason = _streamed_message(first)
        tool_calls = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    else:
        reason, message = first.choices[0].finish_reason, first.choices[0].message
        tool_calls = [c.model_dump() for c in message.tool_calls]
    assert reason == "tool_calls" and tool_calls
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": tool_calls}]
    for call in tool_calls:
        _call_args(openai.types.chat.ChatCompletionMessageToolCall(**call), WEATHER)
        result = {"temperature": 21, "sky": "clear"}
        history.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
    final = client.chat.completions.create(
        messages=history, tool_choice="none", stream=stream, **common
    )
    if stream:
        content, calls, reason = _streamed_message(final)
    else:
        content, calls = final.choices[0].message.content, final.choices[0].message.tool_calls
        reason = final.choices[0].finish_reason
    assert content and not calls and reason in ("stop", "length")
    wait_idle(base)


def test_streamed_and_whole_calls_agree(served):
    """The same sampled call, streamed in deltas and answered whole."""
    client, model, _ = served
    common = {
        "model": model,
        "messages": ASK,
        "tools": [WEATHER, CLOCK],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 64,
        "temperature": 0.9,
        "seed": 7,
    }
    whole = client.chat.completions.create(**common).choices[0]
    _, calls, reason = _streamed_message(client.chat.completions.create(stream=True, **common))
    assert reason == whole.finish_reason == "tool_calls"
    assert [(n, a) for _, n, a in calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
