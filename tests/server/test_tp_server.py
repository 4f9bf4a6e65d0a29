"""A server at --tensor-parallel-size 2: a killed worker makes it report dead (/health 503)
and exit (code 3) within the watchdog's time, leaving no process behind; SIGTERM shuts it
down cleanly, workers included."""

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import start_server
from vtllm.engine.watchdog import EXIT_ENGINE_DEAD

TIMEOUT_S = 5.0


def _workers(pid: int) -> list[int]:
    """The server's spawned worker processes (not multiprocessing's resource tracker)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmdline:
                out.append(int(child))
    return sorted(out)


def _gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{p}").exists() and _alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _start():
    proc, base = start_server(
        "--tensor-parallel-size", "2", "--engine-iteration-timeout-s", str(TIMEOUT_S)
    )
    workers = _workers(proc.pid)
    assert len(workers) == 2, workers
    body = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
    r = httpx.post(base + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return proc, base, workers


def test_killed_worker_reports_dead_and_exits():
    """The issue's CI criterion, so not marked slow (about 10 s: one server start)."""
    proc, base, workers = _start()
    try:
        os.kill(workers[1], signal.SIGKILL)
        killed, saw_503 = time.monotonic(), False
        while proc.poll() is None and time.monotonic() - killed < TIMEOUT_S:
            try:
                saw_503 |= httpx.get(base + "/health", timeout=1).status_code == 503
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        assert saw_503
        assert proc.wait(timeout=TIMEOUT_S) == EXIT_ENGINE_DEAD
        assert _gone(workers, 15.0)
    finally:
        proc.kill()


@pytest.mark.slow
def test_sigterm_ends_the_server_and_its_workers():
    proc, _, workers = _start()
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert _gone(workers, 15.0)
    finally:
        proc.kill()
