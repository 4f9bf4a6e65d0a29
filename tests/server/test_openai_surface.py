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
