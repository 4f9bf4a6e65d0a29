"""The request surface past the sampling settings (server/fields.py): defaults of fields
vtllm does not honour pass, fields no API defines are ignored out loud (a log line and the
Vtllm-Ignored-Fields header) or refused in strict mode, and the fields vLLM added that the
engine already does (max_completion_tokens, priority, prompt_logprobs) reach it."""

import logging
import signal

import httpx
import msgspec
import pytest

from tests.server.conftest import start_server
from tests.server.invariants import scrape, wait_invariants
from vtllm.errors import InvalidParameter
from vtllm.server.fields import IGNORED_HEADER, MAX_NAMED, ignore_unknown
from vtllm.server.protocol import chat_decoder, completion_decoder

C, CC = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
HEADER = IGNORED_HEADER.lower()

# What some client libraries send whatever the user asked: each value asks for nothing.
CHAT_DEFAULTS = {
    "tools": [],
    "tool_choice": "none",
    "parallel_tool_calls": True,
    "functions": [],
    "function_call": "none",
    "response_format": {"type": "text"},
    "store": False,
    "metadata": {},
    "service_tier": "auto",
    "modalities": ["text"],
    "echo": False,
    "chat_template_kwargs": {},
    "continue_final_message": False,
    "best_of": 1,
    "bad_words": [],
    "use_beam_search": False,
    "length_penalty": 1.0,
    "spaces_between_special_tokens": True,
    "guided_json": None,
    "structured_outputs": None,
    "audio": None,
    "prompt_cache_key": "k",
    "safety_identifier": "u",
    "user": "u",
    "stream_options": None,
}
COMPLETION_DEFAULTS = {"suffix": "", "best_of": 2, "n": 2, "response_format": None}


def _c(**fields):
    return {"prompt": "x", "max_tokens": 2, **fields}


def _cc(**fields):
    return {"messages": MSG, "max_tokens": 2, **fields}


def test_defaults_of_unsupported_fields_are_accepted_silently(server):
    r = httpx.post(server + CC, json=_cc(**CHAT_DEFAULTS), timeout=120)
    assert r.status_code == 200, r.text
    assert HEADER not in r.headers
    body = _c(**COMPLETION_DEFAULTS, temperature=1.0, seed=0)
    r = httpx.post(server + C, json=body, timeout=120)
    assert r.status_code == 200 and len(r.json()["choices"]) == 2, r.text
    # an assistant turn of the history with an empty tool_calls list asks for nothing either
    history = [*MSG, {"role": "assistant", "content": "hello", "tool_calls": []}, *MSG]
    r = httpx.post(server + CC, json=_cc(messages=history), timeout=120)
    assert r.status_code == 200, r.text


def test_unknown_fields_run_and_are_named_in_the_header(server):
    r = httpx.post(server + C, json=_c(foo=1, top_logprob=3), timeout=120)
    assert r.status_code == 200 and r.headers[HEADER] == "foo,top_logprob"
    body = _cc(stream=True, stream_options={"include_usage": True, "chunk": 1}, x_vendor={})
    with httpx.stream("POST", server + CC, json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers[HEADER] == "stream_options.chunk,x_vendor"
        assert "data: [DONE]" in r.read().decode()
    # a refusal for another reason still says what was ignored
    r = httpx.post(server + C, json=_c(temperature=-1, foo=1), timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    assert r.headers[HEADER] == "foo"
    r = httpx.post(server + "/tokenize", json={"prompt": "x", "foo": 1}, timeout=120)
    assert r.status_code == 200 and r.headers[HEADER] == "foo"
    # names are cut short, unprintable characters and commas replaced, the list capped
    many = {f"k{i}": 0 for i in range(MAX_NAMED + 4)}
    r = httpx.post(server + C, json=_c(**{"a,b\nc": 1, "n" * 5000: 1}, **many), timeout=120)
    assert r.status_code == 200
    names = r.headers[HEADER].split(",")
    assert names[:2] == ["a?b?c", "n" * 64] and len(names) == MAX_NAMED + 1 and names[-1] == "..."
    r = httpx.post(server + C, json=_c(), timeout=120)
    assert HEADER not in r.headers
    wait_invariants(server)


def test_unknown_fields_are_logged_once_per_request(caplog):
    with caplog.at_level(logging.WARNING, logger="vtllm.server"):
        assert ignore_unknown(["foo", "bar"], strict=False, route="completions") == "foo,bar"
        assert ignore_unknown([], strict=False, route="completions") is None
    assert [r.getMessage() for r in caplog.records] == [
        "completions: ignored unknown request fields: foo,bar"
    ]
    with pytest.raises(InvalidParameter) as info:
        ignore_unknown(["foo\n", "bar"], strict=True, route="completions")
    assert info.value.param == "foo?"


def test_decoder_names_unknown_fields_in_body_order():
    req, unknown = completion_decoder.decode(b'{"prompt": "x", "max_tokens": 1}')
    assert unknown == [] and req.max_tokens == 1
    body = b'{"zz": 1, "prompt": "x", "stream_options": {"q": 1}, "aa": [1]}'
    req, unknown = completion_decoder.decode(body)
    assert unknown == ["zz", "stream_options.q", "aa"] and bytes(req.prompt) == b'"x"'
    with pytest.raises(msgspec.ValidationError, match="max_tokens"):  # the type error wins
        chat_decoder.decode(b'{"zz": 1, "max_tokens": "2"}')


def test_max_completion_tokens_is_max_tokens(server):
    body = {"messages": MSG, "max_completion_tokens": 3, "ignore_eos": True}
    r = httpx.post(server + CC, json=body, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    r = httpx.post(server + CC, json={**body, "max_tokens": 3}, timeout=120)  # agreeing: fine
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    r = httpx.post(server + CC, json={**body, "max_completion_tokens": 10**6}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"


def test_priority_reaches_the_engine(server):
    for priority in (-5, 0, 7):
        r = httpx.post(server + C, json=_c(priority=priority), timeout=120)
        assert r.status_code == 200, r.text


def test_prompt_logprobs_over_http(server):
    ids = [504, 1535, 314, 253, 2641, 30]
    r = httpx.post(server + C, json=_c(prompt=ids, prompt_logprobs=2), timeout=120)
    assert r.status_code == 200, r.text
    entries = r.json()["choices"][0]["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    for token, entry in zip(ids[1:], entries[1:], strict=True):
        own = entry[str(token)]  # the prompt token itself, with its rank among all
        assert own["logprob"] <= 0 and own["rank"] >= 1 and isinstance(own["decoded_token"], str)
        assert 2 <= len(entry) <= 3 and {v["rank"] for v in entry.values()} >= {1, 2}
    plain = httpx.post(server + C, json=_c(prompt=ids), timeout=120).json()
    assert "prompt_logprobs" not in plain["choices"][0]  # absent unless asked
    r = httpx.post(server + CC, json=_cc(prompt_logprobs=0), timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    entries = body["prompt_logprobs"]
    assert len(entries) == body["usage"]["prompt_tokens"] and entries[0] is None
    assert all(len(e) == 1 for e in entries[1:])  # 0: the prompt token's own logprob alone


def test_allowed_token_ids_and_bad_words_reach_the_sampler(server):
    allowed = [28, 29, 30]
    body = _c(prompt="Count:", allowed_token_ids=allowed, max_tokens=6, logprobs=0, ignore_eos=True)
    r = httpx.post(server + C, json=body, timeout=120)
    assert r.status_code == 200, r.text
    tokens = r.json()["choices"][0]["logprobs"]["tokens"]
    assert len(tokens) == 6 and all(t in ",-." for t in tokens)  # ids 28-30: , - .
    prompt = "The capital of France is Paris. The capital of France is"
    free = httpx.post(server + C, json=_c(prompt=prompt, temperature=0), timeout=120).json()
    word = free["choices"][0]["text"].split()[0]
    banned = _c(prompt=prompt, temperature=0, bad_words=[word])
    text = httpx.post(server + C, json=banned, timeout=120).json()["choices"][0]["text"]
    assert word not in text.split()


@pytest.fixture(scope="module")
def strict():
    proc, base = start_server("--strict-request-fields", "true")
    yield base
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (C, _c(foo=1, bar=2), "foo"),
        (C, _c(stream=True, stream_options={"include_usage": True, "q": 1}), "stream_options.q"),
        (CC, _cc(stream=True, temprature=0.5), "temprature"),
        ("/tokenize", {"prompt": "x", "tokens": [1]}, "tokens"),
    ],
)
def test_strict_mode_refuses_unknown_fields(strict, path, body, param):
    before = scrape(strict)
    r = httpx.post(strict + path, json=body, timeout=120)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    after = scrape(strict)
    assert after.value("vt:request_accepted_total") == before.value("vt:request_accepted_total")


def test_strict_mode_still_accepts_every_defined_field(strict):
    r = httpx.post(strict + CC, json=_cc(**CHAT_DEFAULTS, max_completion_tokens=2), timeout=120)
    assert r.status_code == 200 and HEADER not in r.headers, r.text
    wait_invariants(strict)
