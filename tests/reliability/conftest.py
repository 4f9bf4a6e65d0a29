"""One live server for the stream and queue faults (F6, F15, F18, F20), started once per
session: a server start and its idle-task baseline (6 s of settling) cost more than most of
the tests that use it.

Two seats; a queue capped at 8 requests and 600 prompt tokens; a 1 s write-stall timeout
and a 16 KiB kernel send buffer (so a client that stops reading stalls the writer within a
hundred tokens); fault injection on."""

import signal
from dataclasses import dataclass

import pytest

from tests.server.conftest import start_server
from tests.server.invariants import idle_tasks

MAX_QUEUED, MAX_QUEUED_TOKENS, STALL_S = 8, 600, 1.0


@dataclass
class Live:
    proc: object
    base: str
    tasks: float  # vt:event_loop_tasks when idle


@pytest.fixture(scope="session")
def faulty():
    proc, base = start_server(
        "--debug-faults",
        "true",
        "--max-num-seqs",
        "2",
        "--max-queued-requests",
        str(MAX_QUEUED),
        "--max-queued-prompt-tokens",
        str(MAX_QUEUED_TOKENS),
        "--server-write-stall-timeout-s",
        str(STALL_S),
        "--server-send-buffer-bytes",
        "16K",
    )
    yield Live(proc, base, idle_tasks(base))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
