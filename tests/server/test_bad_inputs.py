"""Rows of the bad-input catalog: typed 4xx in the OpenAI envelope, and nothing leaks."""

import socket

import httpx
import pytest

from tests.server.conftest import wait_idle

C, CC = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]

CASES = [
    # (id, path, body or raw bytes, content type, status, param)
    ("form", C, b"prompt=x", "application/x-www-form-urlencoded", 415, None),
    ("text", C, b"{}", "text/plain", 415, None),
    ("truncated", C, b'{"prompt": "x"', "application/json", 400, None),
    ("bad-utf8", C, b'{"prompt": "\xff\xfe"}', "application/json", 400, None),
    ("array", C, [1], None, 400, None),
    ("string", C, "x", None, 400, None),
    ("null", C, b"null", "application/json", 400, None),
    ("nan", C, b'{"prompt": "x", "temperature": NaN}', "application/json", 400, None),
    ("inf", C, b'{"prompt": "x", "temperature": 1e999}', "application/json", 400, "temperature"),
    ("no-messages", CC, {}, None, 400, "messages"),
    ("no-prompt", C, {}, None, 400, "prompt"),
    ("empty-messages", CC, {"messages": []}, None, 400, "messages"),
    ("empty-prompt", C, {"prompt": ""}, None, 400, "prompt"),
    ("empty-prompt-list", C, {"prompt": []}, None, 400, "prompt"),
    ("role-int", CC, {"messages": [{"role": 123, "content": "x"}]}, None, 400, "messages[0].role"),
    (
        "role-wizard",
        CC,
        {"messages": [{"role": "wizard", "content": "x"}]},
        None,
        400,
        "messages[0].role",
    ),
    ("message-empty", CC, {"messages": [{}]}, None, 400, "messages[0].role"),
    ("message-str", CC, {"messages": ["x"]}, None, 400, "messages[0].role"),
    (
        "content-int",
        CC,
        {"messages": [{"role": "user", "content": 123}]},
        None,
        400,
        "messages[0].content",
    ),
    (
        "content-image",
        CC,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                }
            ]
        },
        None,
        400,
        "messages[0].content",
    ),
    ("model", C, {"prompt": "x", "model": "gpt-17"}, None, 404, "model"),
    ("max-tokens-0", C, {"prompt": "x", "max_tokens": 0}, None, 400, "max_tokens"),
    ("max-tokens-neg", C, {"prompt": "x", "max_tokens": -1}, None, 400, "max_tokens"),
    ("max-tokens-str", C, {"prompt": "x", "max_tokens": "10"}, None, 400, "max_tokens"),
    ("max-tokens-float", C, {"prompt": "x", "max_tokens": 10.5}, None, 400, "max_tokens"),
    ("max-tokens-bool", C, {"prompt": "x", "max_tokens": True}, None, 400, "max_tokens"),
    ("max-tokens-huge", C, {"prompt": "x", "max_tokens": 10**23}, None, 400, "max_tokens"),
    ("beyond-context", C, {"prompt": [5] * 1000, "max_tokens": 100}, None, 400, "max_tokens"),
    (
        "long-prompt-stream",
        C,
        {"prompt": [5] * 1100, "max_tokens": 1, "stream": True},
        None,
        400,
        "prompt",
    ),
    ("token-neg", C, {"prompt": [-1]}, None, 400, "prompt"),
    ("token-nested-neg", C, {"prompt": [[-1]]}, None, 400, "prompt"),
    ("token-vocab", C, {"prompt": [49152 + 5]}, None, 400, "prompt"),
    ("many-prompts", C, {"prompt": ["x"] * 10000}, None, 400, "prompt"),
    ("n-huge", C, {"prompt": "x", "n": 1000}, None, 400, "n"),
    ("bias-key", C, {"prompt": "x", "logit_bias": {"abc": 1}}, None, 400, "logit_bias"),
]


@pytest.mark.parametrize(
    ("path", "body", "ctype", "status", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rejected_with_envelope(server, path, body, ctype, status, param):
    if isinstance(body, bytes):
        r = httpx.post(server + path, content=body, headers={"content-type": ctype}, timeout=120)
    else:
        r = httpx.post(server + path, json=body, timeout=120)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param, error
    m = wait_idle(server)
    assert m["vt:kv_cache_used_blocks"] == 0 and m["vt:tracked_requests"] == 0
    ok = httpx.post(server + C, json={"prompt": "Hi", "max_tokens": 2}, timeout=120)
    assert ok.status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "status"), [("GET", "/nope", 404), ("GET", C, 405), ("DELETE", CC, 405)]
)
def test_unknown_route_and_method(server, method, path, status):
    r = httpx.request(method, server + path, timeout=120)
    assert r.status_code == status and "error" in r.json()


def test_body_over_the_cap_is_413(server):
    big = b'{"prompt": "' + b"x" * (5 << 20) + b'"}'
    r = httpx.post(
        server + C, content=big, headers={"content-type": "application/json"}, timeout=120
    )
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


def _raw(base: str, request: bytes) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        return s.recv(200)


@pytest.mark.parametrize(
    "headers",
    [b"X-Big: " + b"a" * (1 << 20) + b"\r\n", b"".join(b"X-H%d: v\r\n" % i for i in range(5000))],
    ids=["one-1MiB-header", "5000-headers"],
)
def test_header_limits_are_431(server, headers):
    reply = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert reply.startswith(b"HTTP/1.1 431")
    wait_idle(server)


def test_chunked_body_growing_past_the_cap_is_413(server):
    def body():
        yield b'{"prompt": "'
        for _ in range(6):
            yield b"x" * (1 << 20)
        yield b'"}'

    r = httpx.post(
        server + C, content=body(), headers={"content-type": "application/json"}, timeout=120
    )
    assert r.status_code == 413
