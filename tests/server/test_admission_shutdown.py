"""One seat and a short queue: keep-alive pings, 429 with Retry-After, API keys, disconnects
while queued, and SIGTERM draining with terminal frames."""

import json
import signal
import threading
import time

import httpx
import pytest

from tests.server.conftest import start_server, wait_idle

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = {"prompt": "Tell me a long story.", "max_tokens": 400, "ignore_eos": True}


@pytest.fixture(scope="module")
def tight():
    proc, base = start_server(
        "--max-num-seqs",
        "1",
        "--max-queued-requests",
        "2",
        "--server-sse-ping-s",
        "0.2",
        "--api-key",
        KEY,
        "--drain-timeout-s",
        "1",
    )
    yield proc, base
    if proc.poll() is None:
        proc.kill()


def _post(base, body, **kw):
    return httpx.post(base + "/v1/completions", json=body, headers=AUTH, timeout=120, **kw)


def _background(fn):
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def _wait_for(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _metric(base, name):
    text = httpx.get(base + "/metrics", timeout=30).text
    return next(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")
    )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Basic {KEY}"},
    ],
)
def test_api_key_required(tight, headers):
    _, base = tight
    r = httpx.post(base + "/v1/completions", json={"prompt": "x"}, headers=headers, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(base + "/health", timeout=30).status_code == 200
    assert _post(base, {"prompt": "x", "max_tokens": 1}).status_code == 200


def test_queue_pings_429_and_disconnect_while_queued(tight):
    _, base = tight
    release, results = threading.Event(), {}

    def hold_the_seat():  # a stream that runs until the test lets it go, then disconnects
        body = {**LONG, "max_tokens": 1000, "stream": True}
        with httpx.stream(
            "POST", base + "/v1/completions", json=body, headers=AUTH, timeout=120
        ) as r:
            for _line in r.iter_lines():
                if release.is_set():
                    break

    holder = _background(hold_the_seat)
    try:
        _wait_for(lambda: _metric(base, "vt:num_requests_running") == 1)
        # A streaming request queued behind it gets keep-alive comments while it waits.
        pings = 0
        body = {**LONG, "stream": True, "max_tokens": 2}
        with httpx.stream(
            "POST", base + "/v1/completions", json=body, headers=AUTH, timeout=120
        ) as r:
            for line in r.iter_lines():
                pings += line == ": ping"
                if pings >= 2:
                    break  # disconnect while still queued
        assert pings >= 2
        _wait_for(lambda: _metric(base, "vt:num_requests_waiting") == 0)
        queued = [
            _background(lambda i=i: results.setdefault(i, _post(base, {**LONG, "max_tokens": 4})))
            for i in range(2)
        ]
        _wait_for(lambda: _metric(base, "vt:num_requests_waiting") == 2)
        refused = _post(base, {"prompt": "x", "max_tokens": 1})
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["type"] == "rate_limit_error"
    finally:
        release.set()
    holder.join(timeout=120)
    for thread in queued:
        thread.join(timeout=120)
    assert [results[i].status_code for i in range(2)] == [200, 200]
    m = wait_idle(base)
    assert m["vt:kv_cache_used_blocks"] == 0 and m["vt:tracked_requests"] == 0


def test_sigterm_drains_then_ends_streams_with_error_frame(tight):
    proc, base = tight
    frames = []

    def stream():
        body = {**LONG, "max_tokens": 900, "stream": True}
        with httpx.stream(
            "POST", base + "/v1/completions", json=body, headers=AUTH, timeout=120
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    frames.append(line[6:])

    reader = _background(stream)
    _wait_for(lambda: len(frames) > 3)
    proc.send_signal(signal.SIGTERM)
    _wait_for(lambda: httpx.get(base + "/health", timeout=30).status_code == 503, timeout=5)
    reader.join(timeout=60)
    assert frames[-1] == "[DONE]" and "error" in json.loads(frames[-2])
    assert proc.wait(timeout=60) == 0
