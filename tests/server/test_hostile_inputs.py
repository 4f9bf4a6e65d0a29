"""The rest of the bad-input catalog, and what an attacker adds: encodings, nesting, numeric
edge cases, duplicate keys, fan-out, header abuse. Each request gets a typed 4xx in the OpenAI
envelope, before any SSE byte (a streaming request is answered as JSON), with a short message
that does not echo the input, and the engine is untouched: it accepted nothing, holds no block,
and the next valid request succeeds."""

import signal
import socket

import httpx
import pytest

from tests.server.conftest import start_server
from tests.server.invariants import scrape, wait_invariants
from tests.server.rawhttp import address

C, CC = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
J = "application/json"
CANARY = "zq" + "x" * 4000 + "qz"  # must never come back in an error message
DEEP = 100_000
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
ORPHAN_RESULT, ORPHAN_P = {"role": "tool", "content": "42"}, "messages[1].tool_call_id"
FUNCTION_RESULT = {"role": "function", "name": "f", "content": "42"}
CALL = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]}
BAD_ARGS = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{"}}]
BAD_ARGS_CALL = {"role": "assistant", "content": None, "tool_calls": BAD_ARGS}
BAD_ARGS_P = "messages[0].tool_calls[0].function"
USER_CALL = {"role": "user", "content": "x", "tool_calls": BAD_ARGS}
BAD_SCHEMA_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}
FN = "tools[0].function"
NAMED_G, NAMED_P = {"type": "function", "function": {"name": "g"}}, "tool_choice.function.name"
REQUIRED = {"tools": [TOOL], "tool_choice": "required"}
JSON_OBJECT = {"type": "json_object"}
BAD_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 1}}}
NAMELESS = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
SCHEMA_P = "response_format.json_schema"
TWO_KINDS = {"regex": "a+", "choice": ["a"]}
WHITESPACE, KW_P = "guided_whitespace_pattern", "chat_template_kwargs"
USAGE_STATS = {"include_usage": True, "continuous_usage_stats": "yes"}  # not a bool
USAGE_PARAM = "stream_options.continuous_usage_stats"
STRUCTURED, PREDICTION = "structured_outputs", "prediction"
TRUNCATE, CONTINUE, M = "truncate_prompt_tokens", "continue_final_message", "messages"
CONTINUE_USER = {"continue_final_message": True, "add_generation_prompt": False}


def _c(**fields):
    return {"prompt": "x", "max_tokens": 2, **fields}


def _cc(**fields):
    return {"messages": MSG, "max_tokens": 2, **fields}


# (id, path, body: JSON value or raw bytes, content type, status, param)
CASES = [
    # catalog 7, 8: body shapes and non-finite numbers
    ("body-number", C, b"42", J, 400, None),
    ("nan-literal", C, b'{"prompt": "x", "temperature": NaN}', J, 400, None),
    ("infinity-literal", C, b'{"prompt": "x", "temperature": Infinity}', J, 400, None),
    ("minus-infinity", C, b'{"prompt": "x", "temperature": -Infinity}', J, 400, None),
    ("temperature-1e999", CC, b'{"messages": [], "temperature": 1e999}', J, 400, None),
    # catalog 14: an unknown content part type
    (
        "part-unknown",
        CC,
        {"messages": [{"role": "user", "content": [{"type": "foo", "foo": 1}]}]},
        None,
        400,
        "messages[0].content",
    ),
    (
        "part-text-not-str",
        CC,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        None,
        400,
        "messages[0].content",
    ),
    # catalog 15: the model name is not echoed
    ("model-huge", C, _c(model=CANARY), None, 404, "model"),
    # catalog 21, 22: sampling ranges
    ("temperature-neg", C, _c(temperature=-1), None, 400, "temperature"),
    ("temperature-3", CC, _cc(temperature=3), None, 400, "temperature"),
    ("top-p-0", C, _c(top_p=0), None, 400, "top_p"),
    ("top-p-1.5", C, _c(top_p=1.5), None, 400, "top_p"),
    ("top-k-neg", C, _c(top_k=-5), None, 400, "top_k"),
    ("top-k-float", C, _c(top_k=1.5), None, 400, "top_k"),
    ("min-p-2", C, _c(min_p=2), None, 400, "min_p"),
    ("presence-5", C, _c(presence_penalty=5), None, 400, "presence_penalty"),
    ("frequency-neg3", C, _c(frequency_penalty=-3), None, 400, "frequency_penalty"),
    ("repetition-0", C, _c(repetition_penalty=0), None, 400, "repetition_penalty"),
    # catalog 23: n
    ("n-0", C, _c(n=0), None, 400, "n"),
    ("n-1e9", C, _c(n=10**9), None, 400, "n"),
    ("n-greedy", C, _c(n=4, temperature=0), None, 400, "n"),
    # catalog 24: logprobs
    ("top-logprobs-21", CC, _cc(logprobs=True, top_logprobs=21), None, 400, "top_logprobs"),
    ("top-logprobs-alone", CC, _cc(top_logprobs=2), None, 400, "top_logprobs"),
    ("logprobs-neg", C, _c(logprobs=-1), None, 400, "logprobs"),
    ("logprobs-21", C, _c(logprobs=21), None, 400, "logprobs"),
    # catalog 25: logit_bias
    ("bias-abc", C, _c(logit_bias={"abc": 1}), None, 400, "logit_bias"),
    ("bias-vocab", C, _c(logit_bias={"999999999": 1}), None, 400, "logit_bias"),
    ("bias-str-value", C, _c(logit_bias={"1": "x"}), None, 400, "logit_bias"),
    ("bias-1e9", C, _c(logit_bias={"1": 1e9}), None, 400, "logit_bias"),
    ("bias-too-many", C, _c(logit_bias={str(i): 1 for i in range(301)}), None, 400, "logit_bias"),
    # catalog 26, 27: stop
    ("stop-empty", C, _c(stop=""), None, 400, "stop"),
    ("stop-five", C, _c(stop=["a", "b", "c", "d", "e"]), None, 400, "stop"),
    ("stop-1MiB", C, _c(stop="s" * (1 << 20)), None, 400, "stop"),
    ("stop-int", C, _c(stop=7), None, 400, "stop"),
    ("stop-ids-bad", C, _c(stop_token_ids=[-1, 10**12]), None, 400, "stop_token_ids"),
    ("stop-ids-many", C, _c(stop_token_ids=list(range(61))), None, 400, "stop_token_ids"),
    # catalog 28, 29: seed and stream
    ("seed-str", C, _c(seed="x"), None, 400, "seed"),
    ("seed-2**70", C, _c(seed=2**70), None, 400, "seed"),
    ("stream-yes", C, _c(stream="yes"), None, 400, "stream"),
    ("stream-options-no-stream", C, _c(stream_options={"include_usage": True}), None, 400, None),
    # catalog 31: a payload full of errors gets one short message
    ("bias-10k-bad-keys", C, _c(logit_bias={f"k{i}{CANARY[:40]}": 1 for i in range(10_000)})),
    # numeric edge cases past the catalog
    ("max-tokens-1e400", C, b'{"prompt": "x", "max_tokens": 1e400}', J, 400, "max_tokens"),
    ("n-1e308", C, _c(n=1e308), None, 400, "n"),
    ("top-k-2**64", C, _c(top_k=2**64), None, 400, "top_k"),
    ("seed-neg-huge", C, _c(seed=-(2**64) - 1), None, 400, "seed"),
    ("temperature-str", C, _c(temperature="0.5"), None, 400, "temperature"),
    ("temperature-bool", C, _c(temperature=True), None, 400, "temperature"),
    ("min-tokens-over-max", C, _c(min_tokens=5, max_tokens=2), None, 400, "min_tokens"),
    # duplicate keys: the last one wins, and it is the one validated
    (
        "duplicate-key",
        C,
        b'{"prompt": "x", "max_tokens": 1, "max_tokens": -1}',
        J,
        400,
        "max_tokens",
    ),
    # prompt shapes
    ("prompt-mixed", C, _c(prompt=[1, "x"]), None, 400, "prompt"),
    ("prompt-empty-inner", C, _c(prompt=[[]]), None, 400, "prompt"),
    ("prompt-3-deep", C, _c(prompt=[[[1]]]), None, 400, "prompt"),
    ("prompt-bools", C, _c(prompt=[True, False]), None, 400, "prompt"),
    # a token-id list whose later items are not ids (the first one decides the list's kind)
    ("prompt-id-then-bool", C, _c(prompt=[1, True]), None, 400, "prompt"),
    ("prompt-id-then-float", C, _c(prompt=[1, 2.5]), None, 400, "prompt"),
    ("prompt-ids-then-null", C, _c(prompt=[[1, 2], [3, None]]), None, 400, "prompt"),
    ("prompt-object", C, _c(prompt={"a": 1}), None, 400, "prompt"),
    ("prompt-id-1e400", C, b'{"prompt": [1, 1e400]}', J, 400, "prompt[1]"),
    ("prompt-ids-over-context", C, _c(prompt=[1] * 5000), None, 400, "prompt"),
    ("prompt-id-then-commas", C, _c(prompt=[1, "a," * 5000]), None, 400, "prompt"),
    # messages shapes (decoded apart from the body, see protocol.py)
    ("messages-str", CC, _cc(messages="hi"), None, 400, "messages"),
    ("messages-empty", CC, _cc(messages=[]), None, 400, "messages"),
    ("messages-2049", CC, _cc(messages=MSG * 2049), None, 400, "messages"),
    ("messages-1e400", CC, b'{"messages": [{"content": 1e400}]}', J, 400, "messages[0]"),
    # fan-out: prompts x n stays under a cap
    ("fan-out", C, _c(prompt=["a"] * 5, n=16, temperature=1.0), None, 400, "n"),
    ("fan-out-64x2", C, _c(prompt=["a"] * 64, n=2, temperature=1.0), None, 400, "n"),
    # fields an API defines that vtllm does not honour yet: once answered 200 as if done
    # structured outputs: each field's bad shapes, named (the grammar engine's own refusals
    # of schemas and regexes it cannot compile are rows further down)
    ("format-sound", C, _c(response_format={"type": "sound"}), None, 400, "response_format.type"),
    ("format-str", C, _c(response_format="json"), None, 400, "response_format"),
    ("format-no-schema", CC, _cc(response_format={"type": "json_schema"}), None, 400, SCHEMA_P),
    ("format-schema-nameless", CC, _cc(response_format=NAMELESS), None, 400, SCHEMA_P + ".name"),
    ("guided-json-number", C, _c(guided_json=5), None, 400, "guided_json"),
    ("guided-regex-list", CC, _cc(guided_regex=["[0-9]+"]), None, 400, "guided_regex"),
    ("guided-choice-empty", C, _c(guided_choice=[]), None, 400, "guided_choice"),
    ("guided-choice-ints", C, _c(guided_choice=[1, 2]), None, 400, "guided_choice"),
    ("guided-grammar-obj", CC, _cc(guided_grammar={"root": "a"}), None, 400, "guided_grammar"),
    ("guided-backend", C, _c(guided_decoding_backend="x"), None, 400, "guided_decoding_backend"),
    ("guided-whitespace", C, _c(guided_whitespace_pattern=" "), None, 400, WHITESPACE),
    ("structured-two", CC, _cc(structured_outputs=TWO_KINDS), None, 400, STRUCTURED),
    ("structured-none", CC, _cc(structured_outputs={}), None, 400, STRUCTURED),
    ("structured-unknown", C, _c(structured_outputs={"x": 1}), None, 400, STRUCTURED + ".x"),
    ("two-constraints", C, _c(guided_json={}, guided_regex="a"), None, 400, "guided_regex"),
    ("format-and-guided", CC, _cc(response_format=JSON_OBJECT, guided_choice=["a"]), None, 400),
    # what the grammar engine cannot compile, refused when the request is added
    ("guided-regex-bad", C, _c(guided_regex="[0-9"), None, 400, "guided_regex"),
    ("format-schema-bad", CC, _cc(response_format=BAD_SCHEMA_FORMAT), None, 400, "response_format"),
    ("guided-grammar-bad", CC, _cc(guided_grammar="start: ("), None, 400, "guided_grammar"),
    ("structured-json-text", C, _c(structured_outputs={"json": "{x"}), None, 400, STRUCTURED),
    # tool calling: tools, tool_choice and the tool turns of the history
    ("tools-object", CC, _cc(tools=TOOL), None, 400, "tools"),
    ("tools-bad-shape", CC, _cc(tools=[{"type": "function", "function": 1}]), None, 400, FN),
    ("tools-1MiB", CC, _cc(tools=[{"x": CANARY}] * 256), None, 400, "tools"),
    ("tools-bad-schema", CC, _cc(tools=[BAD_SCHEMA_TOOL]), None, 400, FN + ".parameters"),
    ("tools-bad-name", CC, _cc(tools=[{"type": "function", "function": {"name": "a b"}}]), None),
    ("tools-same-name", CC, _cc(tools=[TOOL, TOOL]), None, 400, "tools[1].function.name"),
    ("tool-choice-required", CC, _cc(tool_choice="required"), None, 400, "tool_choice"),
    ("tool-choice-unknown", CC, _cc(tools=[TOOL], tool_choice=NAMED_G), None, 400, NAMED_P),
    ("tool-choice-odd", CC, _cc(tools=[TOOL], tool_choice="always"), None, 400, "tool_choice"),
    ("tool-choice-and-format", CC, _cc(**REQUIRED, response_format=JSON_OBJECT), None, 400),
    ("functions", CC, _cc(functions=[TOOL["function"]]), None, 400, "functions"),
    ("function-call", CC, _cc(function_call={"name": "f"}), None, 400, "function_call"),
    ("tool-message-no-id", CC, _cc(messages=[*MSG, ORPHAN_RESULT]), None, 400, ORPHAN_P),
    ("tool-calls-message", CC, _cc(messages=[CALL, *MSG]), None, 400, "messages[0].tool_calls[0]"),
    ("tool-calls-bad-args", CC, _cc(messages=[BAD_ARGS_CALL, *MSG]), None, 400, BAD_ARGS_P),
    ("tool-calls-of-user", CC, _cc(messages=[USER_CALL]), None, 400, "messages[0].tool_calls"),
    ("function-message", CC, _cc(messages=[FUNCTION_RESULT]), None, 400, "messages[0].role"),
    ("best-of-1e6", C, _c(best_of=1_000_000), None, 400, "best_of"),
    ("best-of-over-n", C, _c(best_of=2, n=1), None, 400, "best_of"),
    ("best-of-str", C, _c(best_of="2"), None, 400, "best_of"),
    ("prompt-logprobs-neg", C, _c(prompt_logprobs=-1), None, 400, "prompt_logprobs"),
    ("prompt-logprobs-21", CC, _cc(prompt_logprobs=21), None, 400, "prompt_logprobs"),
    ("prompt-logprobs-stream", C, _c(prompt_logprobs=1, stream=True), None, 400, "prompt_logprobs"),
    ("priority-str", C, _c(priority="high"), None, 400, "priority"),  # honoured when an int
    ("priority-float", CC, _cc(priority=1.5), None, 400, "priority"),
    ("truncate-over-context", C, _c(truncate_prompt_tokens=10**6), None, 400, TRUNCATE),
    ("truncate-below-minus-1", CC, _cc(truncate_prompt_tokens=-2), None, 400, TRUNCATE),
    ("truncate-zero", C, _c(truncate_prompt_tokens=0), None, 400, TRUNCATE),
    ("truncate-str", C, _c(truncate_prompt_tokens="5"), None, 400, TRUNCATE),
    ("bad-words-blank", CC, _cc(bad_words=[" "]), None, 400, "bad_words"),
    ("bad-words-str", CC, _cc(bad_words="x"), None, 400, "bad_words"),
    ("allowed-token-ids-empty", C, _c(allowed_token_ids=[]), None, 400, "allowed_token_ids"),
    ("allowed-token-ids-neg", C, _c(allowed_token_ids=[-1]), None, 400, "allowed_token_ids"),
    ("allowed-token-ids-vocab", C, _c(allowed_token_ids=[1 << 30]), None, 400, "allowed_token_ids"),
    ("suffix", C, _c(suffix="}"), None, 400, "suffix"),
    ("template-kwargs-list", CC, _cc(chat_template_kwargs=[1]), None, 400, "chat_template_kwargs"),
    ("template-kwargs-messages", CC, _cc(chat_template_kwargs={"messages": []}), None, 400, KW_P),
    ("continue-final-and-generation", CC, _cc(continue_final_message=True), None, 400, CONTINUE),
    ("continue-final-user-turn", CC, _cc(**CONTINUE_USER), None, 400, CONTINUE),
    ("continue-final-str", CC, _cc(continue_final_message="yes"), None, 400, CONTINUE),
    ("chat-template", CC, _cc(chat_template="{{ 1 }}"), None, 400, "chat_template"),
    ("chat-echo", CC, _cc(echo=True), None, 400, "echo"),
    ("echo-str", C, _c(echo="yes"), None, 400, "echo"),  # honoured on completions
    ("echo-logprobs-21", C, _c(echo=True, logprobs=21), None, 400, "logprobs"),
    ("echo-max-tokens-neg", C, _c(echo=True, max_tokens=-1), None, 400, "max_tokens"),
    ("beam-search", C, _c(use_beam_search=True), None, 400, "use_beam_search"),
    ("length-penalty", C, _c(length_penalty=2), None, 400, "length_penalty"),
    ("cache-salt", CC, _cc(cache_salt="s"), None, 400, "cache_salt"),
    ("modalities-audio", CC, _cc(modalities=["text", "audio"]), None, 400, "modalities"),
    ("audio", CC, _cc(audio={"voice": "alloy", "format": "wav"}), None, 400, "audio"),
    ("prediction", CC, _cc(prediction={"type": "content", "content": "x"}), None, 400, PREDICTION),
    ("store", CC, _cc(store=True), None, 400, "store"),
    ("metadata", CC, _cc(metadata={"k": "v"}), None, 400, "metadata"),
    ("service-tier", CC, _cc(service_tier="flex"), None, 400, "service_tier"),
    ("reasoning-effort", CC, _cc(reasoning_effort="low"), None, 400, "reasoning_effort"),
    ("web-search", CC, _cc(web_search_options={}), None, 400, "web_search_options"),
    ("usage-stats-str", C, _c(stream=True, stream_options=USAGE_STATS), None, 400, USAGE_PARAM),
    ("max-completion-0", CC, _cc(max_completion_tokens=0), None, 400, "max_completion_tokens"),
    ("max-both-differ", CC, _cc(max_completion_tokens=3), None, 400, "max_completion_tokens"),
    ("tokenize-messages-and-prompt", "/tokenize", {"messages": MSG, "prompt": "x"}, None, 400, M),
    ("tokenize-messages-empty", "/tokenize", {"messages": []}, None, 400, "messages"),
    ("tokenize-messages-str", "/tokenize", {"messages": "hi"}, None, 400, "messages"),
    # nesting: msgspec's depth guard must answer 400, not crash the handler
    ("deep-prompt", C, b'{"prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}", J, 400, None),
    ("deep-unknown-field", C, b'{"x": ' + b"[" * DEEP + b"]" * DEEP + b', "prompt": "a"}', J),
    ("deep-messages", CC, b'{"messages": ' + b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"}", J),
    # encodings
    ("utf8-bom", C, b'\xef\xbb\xbf{"prompt": "x"}', J, 400, None),
    ("utf16-body", C, '{"prompt": "x"}'.encode("utf-16"), J, 400, None),
    ("charset-utf16", C, b'{"prompt": "x"}', "application/json; charset=utf-16", 415, None),
    ("charset-latin1", C, b'{"prompt": "x"}', "application/json; charset=latin-1", 415, None),
    ("overlong-utf8", C, b'{"prompt": "\xc0\xaf"}', J, 400, None),
    ("encoded-surrogate", C, b'{"prompt": "\xed\xa0\x80"}', J, 400, None),
    ("lone-surrogate", C, rb'{"prompt": "\ud800"}', J, 400, None),
    ("swapped-surrogates", C, rb'{"prompt": "\udc00\ud800"}', J, 400, None),
    ("json-content-type-missing", C, b'{"prompt": "x"}', "", 415, None),
    ("content-type-multipart", C, b'{"prompt": "x"}', "multipart/form-data; boundary=x", 415, None),
]
# Defaults for the short rows above: raw bytes with no status given expect 400.
CASES = [c + (J, 400, None)[len(c) - 3 :] if len(c) < 6 else c for c in CASES]


def _streamed(cases):
    """Each JSON case again with stream=true: still decided before any SSE byte."""
    out = []
    for name, path, body, ctype, status, param in cases:
        out.append((name, path, body, ctype, status, param))
        if isinstance(body, dict) and "stream" not in body and "stream_options" not in body:
            out.append((name + "+stream", path, {**body, "stream": True}, ctype, status, param))
    return out


ALL = _streamed(CASES)


@pytest.fixture(scope="module")
def server():
    """A server of its own: the session server's later tests compare greedy text with
    goldens, and should see the engine state they always saw."""
    proc, base = start_server()
    yield base
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


@pytest.fixture(scope="module")
def baseline(server):
    return wait_invariants(server)


def _post(base, path, body, ctype):
    if isinstance(body, bytes):
        headers = {"content-type": ctype} if ctype else {}
        return httpx.post(base + path, content=body, headers=headers, timeout=120)
    return httpx.post(base + path, json=body, timeout=120)


@pytest.mark.parametrize(
    ("path", "body", "ctype", "status", "param"), [c[1:] for c in ALL], ids=[c[0] for c in ALL]
)
def test_hostile_request_is_refused_and_engine_untouched(
    server, baseline, path, body, ctype, status, param
):
    before = scrape(server)
    r = _post(server, path, body, ctype)
    assert r.status_code == status, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")  # not an event stream
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" or status != 400
    if param is not None:
        assert error["param"] == param, error
    assert len(r.content) < 4096 and CANARY[:200] not in r.text
    after = scrape(server)
    assert after.value("vt:request_accepted_total") == before.value("vt:request_accepted_total")
    assert after.value("vt:kv_cache_used_blocks") == 0


def test_valid_requests_still_succeed(server, baseline):
    ok = httpx.post(server + C, json=_c(), timeout=120)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
    # Jinja syntax in a message is data, never template code.
    body = {"messages": [{"role": "user", "content": "{{ raise_exception('x') }}"}]}
    ok = httpx.post(server + CC, json={**body, "max_tokens": 1}, timeout=120)
    assert ok.status_code == 200
    wait_invariants(server)


def test_a_refusal_before_the_body_is_read_closes_the_connection_openly(server, baseline):
    """Refused with its body unread (415, or an unknown route), a request leaves bytes the
    connection cannot be reused past: the response says `Connection: close`, so a keep-alive
    client opens a new connection instead of sending into the closing one. Refused after
    reading (400), or with no body (a GET 404), the connection stays open."""
    body = b'{"prompt": "x"}'
    with httpx.Client(timeout=60) as client:
        for _ in range(20):
            r = client.post(server + C, content=body, headers={"content-type": "x"})
            assert r.status_code == 415 and r.headers.get("connection") == "close"
            r = client.post(server + "/v1/nowhere", content=body, headers={"content-type": J})
            assert r.status_code == 404 and r.headers.get("connection") == "close"
            r = client.post(server + C, json=_c(temperature=-1))
            assert r.status_code == 400 and r.headers.get("connection") != "close"
            r = client.get(server + "/v1/nowhere")
            assert r.status_code == 404 and r.headers.get("connection") != "close"


# -- the HTTP layer: hypercorn (h11) answers these itself, without the app ----------------------

RAW = [
    ("cl-and-te", b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n"),
    ("two-content-lengths", b"Content-Length: 2\r\nContent-Length: 7\r\n", b"{}"),
    ("negative-content-length", b"Content-Length: -1\r\n", b"{}"),
    ("content-length-text", b"Content-Length: abc\r\n", b"{}"),
    ("obs-fold", b"Content-Length: 2\r\nX-A: a\r\n b\r\n", b"{}"),
    ("nul-in-header", b"Content-Length: 2\r\nX-A: a\x00b\r\n", b"{}"),
    ("bad-header-name", b"Content-Length: 2\r\nX A: b\r\n", b"{}"),
    ("bad-chunk-size", b"Transfer-Encoding: chunked\r\n", b"zz\r\n{}\r\n0\r\n\r\n"),
]


@pytest.mark.parametrize(("headers", "body"), [r[1:] for r in RAW], ids=[r[0] for r in RAW])
def test_malformed_http_is_a_4xx_and_the_server_lives(server, baseline, headers, body):
    before = scrape(server)
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with socket.create_connection(address(server), timeout=30) as sock:
        sock.sendall(request + headers + b"\r\n" + body)
        reply = sock.recv(200)
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else None
    assert reply == b"" or 400 <= status < 500, reply  # refused, or the connection dropped
    after = scrape(server)
    assert after.value("vt:request_accepted_total") == before.value("vt:request_accepted_total")
    assert httpx.get(server + "/health", timeout=30).status_code == 200


def test_huge_request_line_is_refused(server, baseline):
    with socket.create_connection(address(server), timeout=30) as sock:
        sock.sendall(b"GET /" + b"a" * (200 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = sock.recv(200)
    assert reply == b"" or reply.split(b" ", 2)[1] in (b"414", b"431", b"400"), reply
    assert httpx.get(server + "/health", timeout=30).status_code == 200
