import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server.invariants import scraper

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*flags: str, env_extra: dict | None = None):
    port = free_port()
    env = {**os.environ, **(env_extra or {})}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vtllm",
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--kv-cache-memory",
            "64M",
            "--max-model-len",
            "1024",
            *flags,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stdout.read().decode()[-2000:]}")
        try:
            # through the scraper's kept-alive connection: a connection of its own would linger
            # in the server's task count for seconds and delay every idle baseline
            if scraper.get(base + "/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not become healthy")


@pytest.fixture(scope="session")
def server():
    proc, base = start_server()
    yield base
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


def metrics(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=120).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            if "le=" not in name and "finished_reason=" not in name:
                values[name.split("{")[0]] = float(value)
    return values


def wait_idle(base: str, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(base)
        idle = m["vt:kv_cache_used_blocks"] == 0 and m["vt:tracked_requests"] == 0
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.05)
