"""The request surface users expect of an OpenAI/vLLM server beyond sampling: served-model
aliases, cached-token usage, usage on every streamed chunk, prompt truncation, continuing
the final assistant message, /tokenize with messages, and echo with prompt logprobs."""

import json
import signal

import httpx
import pytest

from tests.server.conftest import start_server
from tests.server.invariants import wait_invariants

C, CC = "/v1/completions", "/v1/chat/completions"
NAMES = ("smol", "smol-alias")
MSG = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def server():
    proc, base = start_server("--served-model-name", *NAMES)
    yield base
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


def _post(base, path, body):
    r = httpx.post(base + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _events(base, path, body) -> list[dict]:
    with httpx.stream("POST", base + path, json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_every_served_name_is_listed_accepted_and_echoed(server):
    cards = httpx.get(server + "/v1/models", timeout=30).json()["data"]
    assert [c["id"] for c in cards] == list(NAMES)
    for name in NAMES:
        body = _post(server, C, {"model": name, "prompt": "Hi", "max_tokens": 1})
        assert body["model"] == name
    assert _post(server, CC, {"messages": MSG, "max_tokens": 1})["model"] == NAMES[0]
    chunks = _events(
        server, CC, {"model": NAMES[1], "messages": MSG, "max_tokens": 2, "stream": True}
    )
    assert {c["model"] for c in chunks} == {NAMES[1]}
    r = httpx.post(server + C, json={"model": "other", "prompt": "Hi"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    wait_invariants(server)


LONG = "The quick brown fox jumps over the lazy dog. " * 12  # a few KV blocks


def test_usage_counts_prompt_tokens_served_from_the_prefix_cache(server):
    body = {"prompt": LONG, "max_tokens": 1}
    _post(server, C, body)  # fills the cache
    usage = _post(server, C, body)["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert 16 <= cached < usage["prompt_tokens"], usage
    options = {"include_usage": True}
    chunks = _events(server, C, {**body, "stream": True, "stream_options": options})
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
    fresh = _post(server, C, {"prompt": "Zyx?", "max_tokens": 1})  # shorter than a block
    assert fresh["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


@pytest.mark.parametrize("include_usage", [True, False])
def test_continuous_usage_stats_put_usage_on_every_chunk(server, include_usage):
    options = {"include_usage": include_usage, "continuous_usage_stats": True}
    body = {"max_tokens": 4, "ignore_eos": True, "stream": True, "stream_options": options}
    for path, extra in ((C, {"prompt": "Hi"}), (CC, {"messages": MSG})):
        chunks = _events(server, path, {**body, **extra})
        with_choices = [c for c in chunks if c["choices"]]
        assert with_choices and all(c["usage"] is not None for c in with_choices), chunks
        done = [c["usage"]["completion_tokens"] for c in with_choices]
        assert done == sorted(done) and done[-1] == 4
        prompt = with_choices[0]["usage"]["prompt_tokens"]
        assert all(
            c["usage"]["total_tokens"] == prompt + c["usage"]["completion_tokens"]
            for c in with_choices
        )
        last = chunks[-1]
        assert (not last["choices"]) == include_usage  # the final usage chunk: only when asked


def _tokenize(base, **body) -> list[int]:
    r = httpx.post(base + "/tokenize", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def _detokenize(base, ids) -> str:
    return httpx.post(base + "/detokenize", json={"tokens": ids}, timeout=60).json()["prompt"]


def test_truncate_prompt_tokens_keeps_the_last_tokens(server):
    ids = [504 + i % 300 for i in range(1100)]  # longer than the context (1024)
    body = {"prompt": ids, "max_tokens": 1, "echo": True, "truncate_prompt_tokens": 10}
    out = _post(server, C, body)
    assert out["usage"]["prompt_tokens"] == 10
    assert out["choices"][0]["text"].startswith(_detokenize(server, ids[-10:]))
    text = _post(server, C, {**body, "prompt": LONG * 40, "echo": False})  # 20k characters
    assert text["usage"]["prompt_tokens"] == 10
    whole = _post(server, C, {**body, "prompt": ids[:20], "truncate_prompt_tokens": -1})
    assert whole["usage"]["prompt_tokens"] == 20  # -1: the context, as in vLLM
    chat = {"messages": MSG, "max_tokens": 1, "truncate_prompt_tokens": 5}
    assert _post(server, CC, chat)["usage"]["prompt_tokens"] == 5
    for keep in (0, -2, 1025):
        r = httpx.post(server + CC, json={**chat, "truncate_prompt_tokens": keep}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens"


TURN = [*MSG, {"role": "assistant", "content": "The sky is"}]


def test_continue_final_message_ends_the_prompt_inside_the_assistant_turn(server):
    cont = {"messages": TURN, "add_generation_prompt": False, "continue_final_message": True}
    ids = _tokenize(server, **cont)
    assert _detokenize(server, ids).endswith("assistant\nThe sky is")  # no end of turn
    closed = _tokenize(server, messages=TURN, add_generation_prompt=False)
    assert len(closed) > len(ids) and closed[: len(ids)] == ids
    out = _post(server, CC, {**cont, "max_tokens": 3, "ignore_eos": True})
    assert out["usage"]["prompt_tokens"] == len(ids)
    bad = [
        {**cont, "add_generation_prompt": True},  # vLLM: not both
        {**cont, "messages": MSG},  # the last turn is the user's
        {**cont, "messages": [*MSG, {"role": "assistant", "content": " "}]},  # nothing to go on
    ]
    for body in bad:
        r = httpx.post(server + CC, json={**body, "max_tokens": 1}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


def test_tokenize_messages_gives_the_chat_prompt(server):
    ids = _tokenize(server, messages=MSG)
    usage = _post(server, CC, {"messages": MSG, "max_tokens": 1})["usage"]
    assert usage["prompt_tokens"] == len(ids)
    assert _detokenize(server, ids).endswith("Name a colour.\nassistant\n")  # specials skipped
    plain = _tokenize(server, messages=MSG, add_generation_prompt=False)
    assert ids[: len(plain)] == plain and len(ids) > len(plain)
    body = {"messages": MSG, "max_tokens": 1, "add_generation_prompt": False}
    assert _post(server, CC, body)["usage"]["prompt_tokens"] == len(plain)
    for body, param in (
        ({"messages": MSG, "prompt": "x"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({}, "prompt"),
    ):
        r = httpx.post(server + "/tokenize", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


IDS = [504, 1535, 314, 253, 2641, 30]  # a prompt as token ids


def test_echo_with_logprobs_leads_with_the_prompt_tokens(server):
    body = {"prompt": IDS, "max_tokens": 3, "echo": True, "logprobs": 2, "temperature": 0}
    choice = _post(server, C, body)["choices"][0]
    lp, n = choice["logprobs"], len(IDS)
    assert len(lp["tokens"]) == n + len(choice["logprobs"]["tokens"][n:]) > n and choice[
        "text"
    ].startswith("".join(lp["tokens"][:n]))
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts it
    assert all(v <= 0 for v in lp["token_logprobs"][1:])
    assert all(1 <= len(top) <= 2 for top in lp["top_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    scored = _post(server, C, {"prompt": IDS, "max_tokens": 1, "prompt_logprobs": 0})
    entries = scored["choices"][0]["prompt_logprobs"][1:]
    own = [e[str(t)]["logprob"] for t, e in zip(IDS[1:], entries, strict=True)]
    assert lp["token_logprobs"][1:n] == pytest.approx(own, abs=1e-4)
    chunks = _events(server, C, {**body, "stream": True})
    streamed = [t for c in chunks for t in c["choices"][0]["logprobs"]["tokens"]]
    assert (
        streamed == lp["tokens"]
        and "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    )


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_scores_the_prompt(server, stream):
    body = {"prompt": IDS, "max_tokens": 0, "echo": True, "logprobs": 1, "stream": stream}
    if stream:
        chunks = _events(server, C, body)
        text = "".join(c["choices"][0]["text"] for c in chunks)
        tokens = [t for c in chunks for t in (c["choices"][0]["logprobs"] or {}).get("tokens", [])]
        reason = chunks[-1]["choices"][0]["finish_reason"]
    else:
        choice = _post(server, C, body)["choices"][0]
        text, tokens, reason = choice["text"], choice["logprobs"]["tokens"], choice["finish_reason"]
    assert text == _detokenize(server, IDS) and len(tokens) == len(IDS) and reason == "length"
