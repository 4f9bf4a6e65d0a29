"""Faults F7 and F14: a step that raises, a step that hangs, an event loop that hangs. Each is
injected inside the engine (VT_DEBUG_FAULTS), each kills a server of its own: in-flight
requests fail (a 500, or one SSE error frame then [DONE]), /health answers 503, and the
process exits with status 3 after reporting that nothing was left held."""

import json
import re
import threading
import time

import httpx

from tests.server.conftest import start_server
from tests.server.invariants import scrape
from tests.server.rawhttp import read_until, send

C = "/v1/completions"
LONG = {"prompt": "Tell me a long story.", "max_tokens": 600, "ignore_eos": True}
DEAD_LINE = re.compile(
    rb"engine dead \((.+?)\): accepted (\d+), ended (\d+), tracked (\d+), KV blocks in use (\d+)"
)


def _sse_frames(raw: bytes) -> list[str]:
    body = raw.split(b"\r\n\r\n", 1)[1]
    # chunked transfer encoding: keep only the SSE lines
    return [
        line[len(b"data: ") :].decode() for line in body.split(b"\n") if line.startswith(b"data: ")
    ]


def _fault(base, **body):
    r = httpx.post(base + "/debug/fault", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _watch_health(base, proc, seen: list):
    while proc.poll() is None:
        try:
            seen.append(httpx.get(base + "/health", timeout=2).status_code)
        except httpx.HTTPError:
            pass
        time.sleep(0.02)


def _run_fault(kind: str, *flags: str, reason: str):
    proc, base = start_server("--debug-faults", "true", "--max-num-seqs", "4", *flags)
    try:
        stream = send(base, C, {**LONG, "stream": True})
        raw = read_until(stream, b"data: ")
        whole = {}
        waiter = threading.Thread(
            target=lambda: whole.update(r=httpx.post(base + C, json=LONG, timeout=120))
        )
        waiter.start()
        deadline = time.monotonic() + 60
        while scrape(base).value("vt:num_requests_running") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        health: list[int] = []
        watcher = threading.Thread(target=_watch_health, args=(base, proc, health))
        watcher.start()
        _fault(base, kind=kind)
        started = time.monotonic()
        raw += read_until(stream, b"data: [DONE]", timeout=60)
        waiter.join(timeout=60)
        code = proc.wait(timeout=60)
        took = time.monotonic() - started
        watcher.join(timeout=10)
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 3, output[-2000:]
    frames = _sse_frames(raw)
    assert frames[-1] == "[DONE]" and frames.count("[DONE]") == 1
    events = [json.loads(f) for f in frames[:-1]]  # every frame is whole JSON: nothing torn
    assert "error" in events[-1] and all("error" not in e for e in events[:-1])
    r = whole["r"]
    assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
    assert 503 in health, health  # /health told the truth before the process went
    dead = DEAD_LINE.search(output)
    assert dead is not None, output[-2000:]
    assert reason in dead.group(1).decode()
    accepted, ended, tracked, blocks = map(int, dead.groups()[1:])
    assert accepted == ended and tracked == 0 and blocks == 0
    return took


def test_f7_a_step_that_raises_kills_the_engine_cleanly():
    took = _run_fault("raise", reason="engine step failed (InjectedFault)")
    assert took < 20


def test_f14_watchdog_fails_requests_when_a_step_hangs():
    # 4 s: far above a real step of this model, even on a loaded 2-core machine.
    took = _run_fault("hang", "--engine-iteration-timeout-s", "4", reason="within 4s")
    assert took < 20


def test_f14_watchdog_exits_when_the_event_loop_itself_hangs():
    """Nothing on the event loop can run: the watchdog thread ends the process itself."""
    proc, base = start_server(
        "--debug-faults", "true", "--engine-iteration-timeout-s", "4", "--log-level", "error"
    )
    try:
        stream = send(base, C, {**LONG, "stream": True})
        read_until(stream, b"data: ")
        _fault(base, kind="block_loop")
        started = time.monotonic()
        code = proc.wait(timeout=60)
        took = time.monotonic() - started
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 3, output[-2000:]
    assert b"did not shut down" in output
    assert took < 20  # timeout 4 s + grace 4 s, and the slack of a loaded machine


def test_watchdog_off_leaves_a_slow_step_alone():
    """With the watchdog off, a step held for 3 s is just slow: the request completes."""
    proc, base = start_server("--debug-faults", "true", "--engine-iteration-timeout-s", "0")
    try:
        result = {}
        body = {"prompt": "Hi", "max_tokens": 40, "ignore_eos": True}
        thread = threading.Thread(
            target=lambda: result.update(r=httpx.post(base + C, json=body, timeout=120))
        )
        thread.start()
        _fault(base, kind="hang")
        time.sleep(3)
        assert httpx.get(base + "/health", timeout=10).status_code == 200
        _fault(base, kind="release")
        thread.join(timeout=120)
        assert result["r"].status_code == 200
        assert result["r"].json()["usage"]["completion_tokens"] == 40
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
