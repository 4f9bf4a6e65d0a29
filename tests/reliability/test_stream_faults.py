"""Faults around streams, each followed by the invariant check (server: conftest.py):
F6   a client that stops reading its stream,
F15  event-loop blockers (a 2M-token prompt, huge template renders, large n),
F20  an exception inside the SSE writer after the headers went out.

F6: the server's send stalls once the buffers between it and the client are full: a 16 KiB
kernel send buffer here (the kernel doubles it), asyncio's 64 KiB high-water mark, and the
client's own small receive buffer. After the write-stall timeout (1 s here) the request is
aborted and its KV blocks freed, and the kernel resets the connection."""

import json
import socket
import time

import httpx
import pytest

from tests.reliability.streams import PROBE, Probe, gap_bound, p99, stream_gaps
from tests.server.invariants import scrape, wait_invariants
from tests.server.rawhttp import address, read_until, request_bytes, send

C, CC = "/v1/completions", "/v1/chat/completions"


@pytest.fixture(scope="module")
def live(faulty):
    stream_gaps(faulty.base, {**PROBE, "max_tokens": 30})  # first-request costs out of the way
    yield faulty.base, faulty.tasks, stream_gaps(faulty.base)  # a stream's pace on its own


def _until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        time.sleep(0.05)


def _delta(after, before, name, **labels) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


# -- F6 ----------------------------------------------------------------------------------------

# Top-20 logprobs make each chunk about 1.5 KB: the buffers fill within a hundred tokens,
# long before the 900 tokens asked for are generated.
HOSTILE = {
    "messages": [{"role": "user", "content": "Tell me a very long story."}],
    "max_tokens": 900,
    "ignore_eos": True,
    "logprobs": True,
    "top_logprobs": 20,
    "stream": True,
}


def _hostile(base: str) -> socket.socket:
    """A client with a tiny receive buffer that sends its request and never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    sock.connect(address(base))
    sock.sendall(request_bytes(CC, json.dumps(HOSTILE).encode()))
    return sock


def test_f6_a_client_that_stops_reading_is_aborted(live):
    base, tasks, baseline = live
    before = scrape(base)
    sock = _hostile(base)
    try:
        _until(lambda: scrape(base).value("vt:num_requests_running") == 1, 30, "hostile seated")
        seated = time.monotonic()
        probe = Probe(base)
        probe.start()
        aborts = "vt:request_abort_total"
        _until(lambda: _delta(scrape(base), before, aborts, phase="decode") > 0, 30, "abort")
        took = time.monotonic() - seated
        gaps = probe.result()
        # Nothing is held while the client still sits on its socket without reading: blocks,
        # queues and tasks are back at baseline, and the ledger balances.
        m = wait_invariants(base, tasks=tasks)
        sock.settimeout(10)
        with pytest.raises(ConnectionResetError):  # the kernel reset the stalled connection
            while sock.recv(65536):
                pass
    finally:
        sock.close()
    assert took < 20, took  # filling the buffers, then the 1 s stall: not the generation
    assert _delta(m, before, aborts, phase="decode") == 1
    # Seen either by the server's stalled send (the usual case), or, when the stream is so
    # slow that asyncio's 64 KiB buffer is not yet full, by the kernel's backstop
    # (TCP_USER_TIMEOUT, 2 x 1 s + 1 s), which reaches the server as a disconnect.
    stalled = _delta(m, before, "vt:request_write_stall_total")
    reset = _delta(m, before, "vt:request_disconnect_to_abort_seconds_count")
    assert (stalled, reset) in ((1, 0), (0, 1)), (stalled, reset)
    assert _delta(m, before, "vt:request_success_total", finished_reason="abort") == 1
    # The hostile request was cut short: its tokens plus the probe's 120 stay under 900.
    assert _delta(m, before, "vt:generation_tokens_total") < 900
    # The normal stream kept its pace while the other writer was stalled.
    assert p99(gaps) < gap_bound(baseline), (p99(baseline), p99(gaps))


# -- F15 ---------------------------------------------------------------------------------------


def _blockers() -> list[tuple[str, str, bytes, str]]:
    """(name, path, body, param the 400 names): each costs the server real work to refuse."""
    ids = b'{"prompt": [' + b"1," * 2_000_000 + b'1], "max_tokens": 4}'  # 2M tokens, 3.8 MiB
    words = "lorem ipsum dolor sit amet " * 7400  # 199,800 characters: just under the cap
    long_content = [{"role": "user", "content": words}]
    # 2048 messages (the cap) of 97 characters: the template loops 2048 times, renders 240k.
    many = [{"role": "user" if i % 2 else "assistant", "content": "x" * 97} for i in range(2048)]
    spread = [words[:9990]] * 20  # 20 prompts, 199,800 characters in all
    bodies = [
        ("2M-token prompt", C, ids, "prompt"),
        ("200k-character prompt", C, {"prompt": words, "max_tokens": 4}, "prompt"),
        ("200k-character message", CC, {"messages": long_content, "max_tokens": 4}, "prompt"),
        ("2048-message template", CC, {"messages": many, "max_tokens": 4}, "prompt"),
        ("20 long prompts", C, {"prompt": spread, "max_tokens": 4}, "prompt"),
        (
            "100k messages",
            CC,
            {"messages": [{"role": "user", "content": "x"}] * 100_000},
            "messages",
        ),
        ("n of a billion", C, {"prompt": "hi", "n": 10**9}, "n"),
        ("64 prompts x n=16", C, {"prompt": ["hi"] * 64, "n": 16, "temperature": 1}, "n"),
    ]
    return [
        (name, path, body if isinstance(body, bytes) else json.dumps(body).encode(), param)
        for name, path, body, param in bodies
    ]


def test_f15_event_loop_blockers_leave_other_streams_alone(live):
    base, tasks, baseline = live
    before = scrape(base)
    blockers = _blockers()
    probe = Probe(base, {**PROBE, "max_tokens": 150})
    probe.start()
    refused = []
    with httpx.Client(timeout=60, headers={"content-type": "application/json"}) as client:
        while probe.is_alive() and len(refused) < 3 * len(blockers):
            name, path, body, param = blockers[len(refused) % len(blockers)]
            started = time.monotonic()
            r = client.post(base + path, content=body)
            refused.append((name, r.status_code, time.monotonic() - started))
            assert r.status_code == 400, (name, r.text[:300])
            assert r.json()["error"]["param"] == param, (name, r.text[:300])
    gaps = probe.result()
    assert len(refused) >= len(blockers), refused  # every kind fired while the probe streamed
    # Refused within a second each, on a loaded 2-core machine.
    assert max(t for _, _, t in refused) < 3.0, refused
    assert p99(gaps) < gap_bound(baseline), (p99(baseline), p99(gaps), refused)
    m = wait_invariants(base, tasks=tasks)
    assert _delta(m, before, "vt:request_accepted_total") == 1  # the probe alone got in


# -- F20 ---------------------------------------------------------------------------------------


def _dechunk(raw: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response, refusing anything malformed."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    body = b""
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return body
        body, rest = body + rest[:size], rest[size:]
        assert rest.startswith(b"\r\n")
        rest = rest[2:]


def test_f20_exception_in_the_sse_writer_ends_with_an_error_frame(live):
    base, tasks, _ = live
    before = scrape(base)
    r = httpx.post(base + "/debug/fault", json={"kind": "frame_raise", "steps": 4}, timeout=30)
    assert r.status_code == 200, r.text
    body = {"prompt": "Tell me a story.", "max_tokens": 200, "ignore_eos": True, "stream": True}
    sock = send(base, C, body)
    raw = read_until(sock, b"0\r\n\r\n", timeout=60)  # the last chunk of the response
    sock.close()
    events = _dechunk(raw).decode().split("\n\n")
    assert events[-1] == ""  # the stream ends on an event boundary
    frames = [e for e in events[:-1] if not e.startswith(":")]  # keep-alive comments aside
    assert all(f.startswith("data: ") and "\n" not in f for f in frames), frames
    payloads = [f[len("data: ") :] for f in frames]
    assert payloads[-1] == "[DONE]" and payloads.count("[DONE]") == 1
    chunks = [json.loads(p) for p in payloads[:-1]]  # every line whole JSON: nothing torn
    assert len(chunks) == 4  # three good frames, then the error frame in place of the fourth
    assert "error" in chunks[-1] and all("choices" in c for c in chunks[:-1])
    assert chunks[-1]["error"]["type"] == "internal_error"
    # The next request is served as usual.
    ok = httpx.post(base + C, json={**body, "stream": False, "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
    m = wait_invariants(base, tasks=tasks)
    assert _delta(m, before, "vt:request_abort_total", phase="decode") == 1  # the failed stream
    assert _delta(m, before, "vt:request_success_total", finished_reason="length") == 1
