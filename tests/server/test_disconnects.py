"""Phase metrics, and clients that leave while queued, during a chunked prefill, mid-stream or
while waiting for a whole response; a body trickled past its deadline. Two seats and a
16-token step budget, so a 300-token prompt takes many steps to prefill. Keep-alive pings stay
at their 15 s default: an abort that waited for the next write would be far too late here."""

import random
import signal
import socket
import threading
import time

import httpx
import pytest

from tests.server.conftest import start_server
from tests.server.invariants import idle_tasks, scrape, wait_invariants
from tests.server.rawhttp import address, disconnect, read_until, request_bytes, send

C = "/v1/completions"
HOLD = {"prompt": "Tell me a long story.", "max_tokens": 500, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def small():
    proc, base = start_server(
        "--max-num-batched-tokens", "16", "--max-num-seqs", "2", "--server-body-timeout-s", "1"
    )
    yield base, idle_tasks(base)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0


def _wait_for(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        time.sleep(0.02)


def _gauge(base, name):
    return scrape(base).value(name)


def _aborts(m, phase):
    return m.value("vt:request_abort_total", phase=phase)


def _unique_prompt(n: int, seed: int) -> list[int]:
    """Token ids no earlier request used, so the prefix cache cannot shorten the prefill."""
    rng = random.Random(seed)
    return [rng.randrange(1000, 40000) for _ in range(n)]


def test_phase_histograms_and_counters_move_once_per_request(small):
    base, tasks = small
    before = scrape(base)
    r = httpx.post(base + C, json={"prompt": "Hello", "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200
    after = wait_invariants(base, tasks=tasks)
    for name in (
        "vt:request_queue_time_seconds_count",
        "vt:request_prefill_time_seconds_count",
        "vt:request_decode_time_seconds_count",
        "vt:request_accepted_total",
    ):
        assert after.value(name) - before.value(name) == 1, name
    assert (
        after.value("vt:request_success_total", finished_reason="length")
        - before.value("vt:request_success_total", finished_reason="length")
        == 1
    )
    assert after.total("vt:request_abort_total") == before.total("vt:request_abort_total")
    assert after.value("vt:request_disconnect_to_abort_seconds_count") == before.value(
        "vt:request_disconnect_to_abort_seconds_count"
    )
    spent = after.value("vt:request_decode_time_seconds_sum") - before.value(
        "vt:request_decode_time_seconds_sum"
    )
    assert spent > 0  # two decode steps after the first token


def test_disconnect_while_queued_is_removed_before_prefill(small):
    base, tasks = small
    holders = [send(base, C, HOLD) for _ in range(2)]
    try:
        for h in holders:
            read_until(h, b"data: ")  # both seats are decoding
        before = scrape(base)
        queued = send(base, C, {**HOLD, "max_tokens": 4})
        _wait_for(lambda: _gauge(base, "vt:num_requests_waiting") == 1, what="queued")
        disconnect(queued)
        gone = time.monotonic()
        _wait_for(lambda: _gauge(base, "vt:num_requests_waiting") == 0, timeout=5)
        assert time.monotonic() - gone < 3  # noticed at once, not at the next ping (15 s)
        after = scrape(base)
        assert _aborts(after, "queued") - _aborts(before, "queued") == 1
        # It was never scheduled: no queue-time observation came from it.
        assert after.value("vt:request_queue_time_seconds_count") == before.value(
            "vt:request_queue_time_seconds_count"
        )
        assert (
            after.value("vt:request_disconnect_to_abort_seconds_count")
            - before.value("vt:request_disconnect_to_abort_seconds_count")
            == 1
        )
        assert after.value("vt:num_requests_running") == 2  # the holders go on
    finally:
        for h in holders:
            disconnect(h)
    m = wait_invariants(base, tasks=tasks)
    assert _aborts(m, "decode") - _aborts(before, "decode") == 2


def test_disconnect_during_chunked_prefill_leaves_batch_mate_alone(small):
    base, tasks = small
    mate = {"prompt": "The capital of France is", "max_tokens": 24, "temperature": 0.0}
    mate.update(ignore_eos=True)
    alone = httpx.post(base + C, json=mate, timeout=120).json()["choices"][0]["text"]
    before = scrape(base)
    result = {}
    thread = threading.Thread(
        target=lambda: result.update(r=httpx.post(base + C, json=mate, timeout=120))
    )
    thread.start()  # the mate decodes first, so the long prompt shares steps with it
    _wait_for(lambda: _gauge(base, "vt:num_requests_running") == 1, what="mate seated")
    # 900 new tokens at 15 a step: some 60 steps of prefill.
    long = send(base, C, {"prompt": _unique_prompt(900, 1), "max_tokens": 4, "stream": True})
    _wait_for(lambda: _gauge(base, "vt:num_requests_running") == 2, what="both seated")
    disconnect(long)
    thread.join(timeout=120)
    assert result["r"].json()["choices"][0]["text"] == alone
    after = wait_invariants(base, tasks=tasks)
    assert _aborts(after, "prefill") - _aborts(before, "prefill") == 1
    assert after.total("vt:request_abort_total") - before.total("vt:request_abort_total") == 1
    assert (
        after.value("vt:request_prefill_time_seconds_count")
        - before.value("vt:request_prefill_time_seconds_count")
        == 1
    )  # the mate's; the aborted prompt never produced a token


def test_disconnect_mid_stream_aborts_within_a_step(small):
    base, tasks = small
    before = scrape(base)
    sock = send(base, C, HOLD)
    data = b""
    while data.count(b"data: ") < 3:
        data += read_until(sock, b"data: ")
    disconnect(sock, reset=True)
    m = wait_invariants(base, tasks=tasks)
    assert _aborts(m, "decode") - _aborts(before, "decode") == 1
    n = m.value("vt:request_disconnect_to_abort_seconds_count")
    assert n - before.value("vt:request_disconnect_to_abort_seconds_count") == 1
    # From the disconnect to the freed blocks: well under a second.
    took = m.value("vt:request_disconnect_to_abort_seconds_sum") - before.value(
        "vt:request_disconnect_to_abort_seconds_sum"
    )
    assert 0 <= took < 1.0


def test_disconnect_while_waiting_for_a_whole_response(small):
    base, tasks = small
    before = scrape(base)
    sock = send(base, C, {**HOLD, "stream": False})
    _wait_for(lambda: _gauge(base, "vt:num_requests_running") == 1, what="seated")
    disconnect(sock)
    m = wait_invariants(base, tasks=tasks)
    assert m.total("vt:request_abort_total") - before.total("vt:request_abort_total") == 1


def test_clients_that_leave_around_the_last_token_end_once(small):
    """Requests so short that the client's close races the finish: each ends exactly once,
    either completed or aborted, and nothing is freed twice."""
    base, tasks = small
    before = scrape(base)
    for i in range(8):
        sock = send(base, C, {"prompt": "Hi", "max_tokens": 1 + i % 2, "stream": i % 2 == 0})
        if i % 4 < 2:
            read_until(sock, b"\r\n\r\n", timeout=60)
        disconnect(sock, reset=i % 3 == 0)
    m = wait_invariants(base, tasks=tasks)
    # A client gone before its body was read never reaches the engine; the four that read
    # their response headers did.
    accepted = m.value("vt:request_accepted_total") - before.value("vt:request_accepted_total")
    assert 4 <= accepted <= 8
    assert m.total("vt:request_success_total") - before.total("vt:request_success_total") == (
        accepted
    )


def test_trickled_body_gets_408_at_the_deadline(small):
    """Catalog row 4: one byte at a time never trips a per-read timeout; the body deadline
    (1 s here) does."""
    base, tasks = small
    before = scrape(base)
    body = b'{"prompt": "hello there", "max_tokens": 2}'
    head = request_bytes(C, body)[: -len(body)]
    with socket.create_connection(address(base), timeout=30) as sock:
        sock.sendall(head)
        started, reply = time.monotonic(), b""
        sock.settimeout(0.25)
        for byte in body:
            try:
                sock.sendall(bytes([byte]))
                reply += sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if reply:
                break
        took = time.monotonic() - started
        if b"}}" not in reply:
            reply += read_until(sock, b"}}", timeout=5)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"error"' in reply and took < 5
    m = wait_invariants(base, tasks=tasks)
    assert m.value("vt:request_accepted_total") == before.value("vt:request_accepted_total")
