"""F17: requests while the model loads and warms up. The server binds its socket only after
a real forward has worked, so until then a client sees "connection refused"; the catalog's
other acceptable answer, a 503 (with the OpenAI envelope on API routes), is accepted too.
What must never happen is a 200 before the warm-up forward finished."""

import signal
import subprocess
import sys
import threading
import time
from datetime import datetime

import httpx

from tests.server.conftest import ROOT, free_port

HOLD_S = 2.0


KINDS = ("health", "api")


def _poll(base: str, seen: list, stop: threading.Event) -> None:
    """Asks /health and an API route, as fast as they answer, until told to stop."""
    body = {"prompt": "hi", "max_tokens": 1}
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            for kind in KINDS:
                try:
                    if kind == "health":
                        r = client.get(base + "/health")
                    else:
                        r = client.post(base + "/v1/completions", json=body)
                    outcome = r.status_code
                    if r.status_code == 503 and kind == "api":
                        assert r.json()["error"]["type"] == "service_unavailable"
                except httpx.ConnectError:
                    outcome = "refused"
                seen.append((time.time(), kind, outcome))
            time.sleep(0.02)


def _log_time(output: str, marker: str) -> float:
    """The wall-clock time of the server's log line holding `marker`."""
    line = next(ln for ln in output.splitlines() if marker in ln)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_f17_nothing_answers_200_before_a_real_forward_has_worked():
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    spawned = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vtllm", "serve", "--port", str(port), "--log-level", "info"]
        + ["--kv-cache-memory", "64M", "--max-model-len", "1024"]
        + ["--debug-warmup-delay-s", str(HOLD_S)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list = []
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(base, seen, stop), daemon=True)
    poller.start()
    try:
        deadline = time.monotonic() + 120
        # both kinds until each has said 200: readiness may flip between a poll's two asks
        while not all(any(k == kind and o == 200 for _, k, o in seen) for kind in KINDS):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        stop.set()
        poller.join(timeout=30)
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output[-2000:]
    held = _log_time(output, "holding the warm-up")
    warmed = _log_time(output, "ready in")
    assert warmed - held >= HOLD_S - 0.01 and held >= spawned - 1
    early = [(k, o) for t, k, o in seen if t < warmed]
    assert len(early) >= 20, early  # the poller really asked during load and warm-up
    assert all(o in ("refused", 503) for _, o in early), early
    first_ok = min(t for t, k, o in seen if k == "health" and o == 200)
    assert first_ok >= warmed  # /health said 200 only after the forward had worked
