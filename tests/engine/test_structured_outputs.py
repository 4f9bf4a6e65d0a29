"""Constrained sampling on the default model: structured outputs (llguidance), allowed_token_ids
and bad_words hold on sampled outputs; bad grammars are refused naming their field."""

import json
import re

import numpy as np
import pytest

from vtllm import LLM, SamplingParams
from vtllm.engine.structured import TokenConstraint
from vtllm.errors import InvalidParameter
from vtllm.scheduler.sampling_params import StructuredOutputs

N = 12  # sampled outputs per constraint


@pytest.fixture(scope="module")
def llm():
    engine = LLM()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompt(llm):
    return llm.render_chat([{"role": "user", "content": "Describe a person as JSON."}])


def _sample(llm, prompt, max_tokens=40, **params):
    seeds = range(N)
    outs = llm.generate(
        [prompt] * N,
        [SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=s, **params) for s in seeds],
    )
    return [o.outputs[0] for o in outs]


SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "ok": {"type": "boolean"},
        },
        "required": ["tags", "ok"],
        "additionalProperties": False,
    },
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["person", "enum-array"])
def test_json_schema_outputs_parse_and_hold_the_schema(llm, prompt, schema):
    outs = _sample(llm, prompt, max_tokens=60, structured_outputs=StructuredOutputs(json=schema))
    finished = [o for o in outs if o.finish_reason == "stop"]
    assert len(finished) >= N // 2, [o.text for o in outs]
    for out in finished:
        value = json.loads(out.text)
        assert set(value) == set(schema["required"]), out.text
        for key, prop in schema["properties"].items():
            if prop.get("type") == "integer":
                assert isinstance(value[key], int) and value[key] >= prop["minimum"]
            if prop.get("type") == "array":
                assert len(value[key]) <= prop["maxItems"]
                assert set(value[key]) <= set(prop["items"]["enum"])


def test_regex_and_choice_hold_on_every_sample(llm, prompt):
    pattern = r"[0-9]{3}-[0-9]{4}"
    outs = _sample(llm, prompt, structured_outputs=StructuredOutputs(regex=pattern))
    assert all(re.fullmatch(pattern, o.text) and o.finish_reason == "stop" for o in outs), [
        o.text for o in outs
    ]
    choices = ["red", "green", "blue"]
    outs = _sample(llm, prompt, structured_outputs=StructuredOutputs(choice=choices))
    assert all(o.text in choices and o.finish_reason == "stop" for o in outs)
    assert len({o.text for o in outs}) > 1  # sampled, not forced to one


def test_json_object_gives_an_object(llm, prompt):
    outs = _sample(
        llm, prompt, max_tokens=80, structured_outputs=StructuredOutputs(json_object=True)
    )
    finished = [o for o in outs if o.finish_reason == "stop"]
    assert finished and all(isinstance(json.loads(o.text), dict) for o in finished)


def test_allowed_token_ids_and_bad_words(llm, prompt):
    allowed = [llm.tokenizer.encode(w, add_special_tokens=False)[0] for w in ("yes", " no", "!")]
    outs = _sample(llm, prompt, max_tokens=8, allowed_token_ids=allowed)
    assert all(set(o.token_ids) <= set(allowed) for o in outs)
    plain = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24))[0].outputs[0]
    word = plain.text.split()[1]  # a word greedy decoding does produce
    banned = llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=24, bad_words=[word])
    )[0].outputs[0]
    assert word in plain.text and word not in banned.text.split()


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutputs(json={"type": "objectx"}, field="response_format"),
        StructuredOutputs(json="{not json", field="guided_json"),
        StructuredOutputs(regex="a(", field="guided_regex"),
        StructuredOutputs(grammar="start: (", field="guided_grammar"),
    ],
    ids=["schema", "schema-text", "regex", "grammar"],
)
def test_a_grammar_that_does_not_compile_is_refused_naming_its_field(llm, spec):
    with pytest.raises(InvalidParameter) as err:
        llm.generate(["hi"], SamplingParams(structured_outputs=spec))
    assert err.value.param == spec.field
    assert not llm.scheduler.requests


def test_one_spec_of_exactly_one_kind():
    with pytest.raises(InvalidParameter, match="exactly one"):
        StructuredOutputs(regex="a", choice=["a"])
    with pytest.raises(InvalidParameter, match="bad_words"):
        SamplingParams(bad_words=[" "])
    with pytest.raises(InvalidParameter, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[])


def test_bad_word_masks_its_last_token_only_after_its_prefix():
    c = TokenConstraint(64, bad_words=((5,), (7, 8, 9)))
    row = np.empty(2, np.int32)

    def allowed():
        c.fill(row)
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")
        return {t for t in (5, 8, 9, 10) if bits[t]}

    assert allowed() == {8, 9, 10}  # a one-token word is always banned
    c.accept(7)
    assert allowed() == {8, 9, 10}
    c.accept(8)
    assert allowed() == {8, 10}
    c.accept(3)
    assert allowed() == {8, 9, 10}
