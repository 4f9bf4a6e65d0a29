"""Faults F12 and F13 (F11, a drain with streams in flight, is in
tests/server/test_admission_shutdown.py): SIGTERM with a zero drain deadline, and a second
signal while draining."""

import json
import signal
import time

import httpx

from tests.server.conftest import start_server
from tests.server.rawhttp import read_until, send

C = "/v1/completions"
LONG = {"prompt": "Tell me a long story.", "max_tokens": 900, "ignore_eos": True, "stream": True}


def _frames(raw: bytes) -> list[str]:
    body = raw.split(b"\r\n\r\n", 1)[1]
    return [ln[6:].decode() for ln in body.split(b"\n") if ln.startswith(b"data: ")]


def test_f12_sigterm_with_zero_drain_deadline():
    proc, base = start_server("--drain-timeout-s", "0")
    try:
        streams = [send(base, C, LONG) for _ in range(2)]
        raws = [read_until(s, b"data: ") for s in streams]
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        raws = [
            raw + read_until(s, b"data: [DONE]", timeout=30)
            for raw, s in zip(raws, streams, strict=True)
        ]
        code = proc.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0 and took < 10
    for raw in raws:  # every stream got its terminal error frame, then [DONE]
        frames = _frames(raw)
        assert frames[-1] == "[DONE]" and "error" in json.loads(frames[-2])


def test_f13_second_signal_while_draining_exits_at_once():
    proc, base = start_server("--drain-timeout-s", "60")
    try:
        stream = send(base, C, LONG)
        read_until(stream, b"data: ")
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(base + "/health", timeout=5).status_code != 503:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # Draining: new work is refused at once.
        r = httpx.post(base + C, json={"prompt": "x", "max_tokens": 1}, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code != 0 and took < 5  # not the 60 s drain
