"""loadtest/bench_serve.py: a small live run, its stream checker on crafted streams, bad input.

The tools are scripts (loadtest/ is not a package and imports nothing from vtllm), so they run
as subprocesses here, and stream_check.py is loaded from its path.
"""

import http.server
import importlib.util
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.server.conftest import ROOT, free_port, start_server

BENCH = ROOT / "loadtest" / "bench_serve.py"
_spec = importlib.util.spec_from_file_location(
    "stream_check", ROOT / "loadtest" / "stream_check.py"
)
stream_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stream_check)


def bench(*flags: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def live():
    proc, base = start_server()
    yield base
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


# -- live runs -----------------------------------------------------------------------------------


def test_completions_run_is_verified_and_measured(live, tmp_path):
    out = tmp_path / "run.json"
    r = bench(
        *("--base-url", live, "--endpoint", "completions", "--num-prompts", "12"),
        *("--input-len", "32", "--output-len", "8", "--max-concurrency", "4", "--ignore-eos"),
        *("--warmup", "2", "--slo", "ttft=60000,tpot=60000", "--save-json", str(out)),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Serving Benchmark Result" in r.stdout and "Mean TTFT (ms)" in r.stdout
    record = json.loads(out.read_text())
    s = record["summary"]
    assert (s["completed"], s["failed"], s["failures"]) == (12, 0, {})
    assert s["finish_reasons"] == {"length": 12}
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (12 * 32, 12 * 8)
    assert s["request_goodput"] == pytest.approx(s["request_throughput"])
    assert 0 < s["duration_s"] < 60 and s["output_throughput"] > 0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        stats = s[key]
        assert 0 < stats["median"] <= stats["p90"] <= stats["p99"], (key, stats)
    assert s["ttft_ms"]["mean"] < s["e2el_ms"]["mean"]
    assert len(record["requests"]) == 12
    for req in record["requests"]:
        assert req["ok"] and req["error"] is None
        assert (req["prompt_tokens"], req["output_tokens"]) == (32, 8)
        assert 0 < req["ttft"] <= req["e2el"] and req["tpot"] > 0
        assert 1 <= len(req["itl"]) <= 7  # chunks after the first; merged chunks make fewer


def test_chat_run_with_shared_prefix_and_poisson_arrivals(live, tmp_path):
    out = tmp_path / "chat.json"
    r = bench(
        *("--base-url", live, "--endpoint", "chat", "--num-prompts", "4"),
        *("--input-len", "12", "--output-len-range", "2:6", "--shared-prefix", "24"),
        *("--request-rate", "20", "--burstiness", "0.5", "--ignore-eos"),
        *("--token-count", "usage", "--save-json", str(out)),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    record = json.loads(out.read_text())
    assert record["summary"]["failed"] == 0
    for req in record["requests"]:
        # the chat template wraps the content: the server counts more than the content's tokens
        assert req["prompt_tokens"] > req["input_len"] >= 24 + 12 - 2
        assert req["output_tokens"] == req["output_len"] and 2 <= req["output_len"] <= 6


# -- the checker on crafted streams ---------------------------------------------------------------


def chunk(text, *, reason=None, n=1, lp=True, **extra):
    logprobs = {"tokens": ["t"] * n, "token_logprobs": [-1.0] * n} if lp else None
    choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
    body = {"id": "c1", "object": "text_completion", "choices": [choice], "usage": None}
    return "data: " + json.dumps(body | extra) + "\n\n"


def usage(completion, prompt=3):
    total = prompt + completion
    body = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
    return (
        "data: "
        + json.dumps({"id": "c1", "object": "text_completion", "choices": [], "usage": body})
        + "\n\n"
    )


DONE = "data: [DONE]\n\n"
GOOD = [chunk("Hel"), chunk("lo", n=2), chunk(" you", reason="length"), usage(4), DONE]

CASES = [
    ("good", GOOD, None),
    ("ping-comments", [": ping\n\n", *GOOD], None),
    ("duplicate-done", [*GOOD, DONE], "duplicate_done"),
    ("no-done", GOOD[:-1], "missing_done"),
    ("after-done", [*GOOD, chunk("x")], "after_done"),
    ("bad-json", ["data: {not json\n\n", *GOOD], "bad_json"),
    ("error-frame", [chunk("a"), 'data: {"error": {"message": "boom"}}\n\n', DONE], "error_frame"),
    ("bad-utf8", [b'data: {"id": "c1", "choices": "\xff"}\n\n', *GOOD], "bad_utf8"),
    ("lone-surrogate", [chunk("\ud800"), *GOOD], "bad_utf8"),
    ("usage-mismatch", [*GOOD[:3], usage(5), DONE], "usage_mismatch"),
    ("no-usage", [*GOOD[:3], DONE], "usage_count"),
    ("two-usage", [*GOOD[:4], usage(4), DONE], "usage_count"),
    ("usage-with-choices", [*GOOD[:3], chunk("", usage={"a": 1}), DONE], "usage_misplaced"),
    ("content-after-usage", [*GOOD[:4], chunk("x"), DONE], "usage_misplaced"),
    ("no-finish", [chunk("a"), usage(1), DONE], "no_finish"),
    ("after-finish", [chunk("a", reason="stop"), chunk("b"), usage(2), DONE], "chunk_after_finish"),
    ("no-logprobs", [chunk("a", lp=False), *GOOD], "missing_logprobs"),
    ("wrong-object", [chunk("a", object="chat.completion.chunk"), *GOOD], "bad_chunk"),
    ("id-changes", [chunk("a"), chunk("b", id="c2", reason="stop"), usage(2), DONE], "bad_chunk"),
    ("not-sse", ["<html>\n", *GOOD], "bad_sse"),
    ("truncated", [*GOOD, "data: {"], "truncated"),
    ("short-for-ignore-eos", [chunk("a", reason="stop"), usage(1), DONE], "length_mismatch"),
]


@pytest.mark.parametrize("name,events,kind", CASES, ids=[c[0] for c in CASES])
def test_stream_check(name, events, kind):
    raw = b"".join(e if isinstance(e, bytes) else e.encode() for e in events)
    expect = 4 if name == "short-for-ignore-eos" else None
    for pieces in ([raw], [raw[i : i + 1] for i in range(len(raw))]):  # whole, byte by byte
        check = stream_check.StreamCheck(chat=False, max_tokens=4, expect_tokens=expect)
        for piece in pieces:
            check.feed(piece)
        check.finish()
        assert (check.error or (None,))[0] == kind, check.error
        if kind is None:
            assert check.num_tokens == 4 and check.finish_reason == "length"
            assert "".join(check.text) == "Hello you"


# llama.cpp's llama-server on /v1/completions: the usage rides on the finish_reason chunk.
def usage_body(completion):
    return {"prompt_tokens": 3, "completion_tokens": completion, "total_tokens": 3 + completion}


def finish_with_usage(completion):
    return chunk("", reason="length", lp=False, usage=usage_body(completion))


PEER = [chunk("Hel", lp=False), chunk("lo", lp=False), chunk(" you", lp=False)]
PEER_CASES = [
    ("peer-shape", [*PEER, finish_with_usage(3), DONE], False, "usage_misplaced"),
    ("peer-shape-allowed", [*PEER, finish_with_usage(3), DONE], True, None),
    (
        "separate-usage-allowed",
        [*PEER[:2], chunk(" you", reason="length"), usage(3), DONE],
        True,
        None,
    ),
    (
        "usage-before-finish",
        [*PEER[:2], chunk(" you", usage=usage_body(3)), DONE],
        True,
        "usage_misplaced",
    ),
    (
        "content-after-finish-usage",
        [*PEER, finish_with_usage(3), chunk("x"), DONE],
        True,
        "usage_misplaced",
    ),
    ("finish-usage-mismatch", [*PEER, finish_with_usage(5), DONE], True, "length_mismatch"),
    ("finish-usage-twice", [*PEER, finish_with_usage(3), usage(3), DONE], True, "usage_count"),
]


@pytest.mark.parametrize("name,events,allow,kind", PEER_CASES, ids=[c[0] for c in PEER_CASES])
def test_usage_with_finish_is_an_explicit_allowance(name, events, allow, kind):
    check = stream_check.StreamCheck(
        chat=False, count="usage", max_tokens=3, expect_tokens=3, usage_with_finish=allow
    )
    check.feed("".join(events).encode())
    check.finish()
    assert (check.error or (None,))[0] == kind, check.error
    if kind is None:
        assert check.output_tokens == 3 and "".join(check.text) == "Hello you"


class _PeerLike(http.server.BaseHTTPRequestHandler):
    """Streams /v1/completions as llama.cpp's llama-server does (usage on the finish chunk) over
    keep-alive HTTP/1.1 connections, and counts connections and requests."""

    protocol_version = "HTTP/1.1"
    connections = requests = 0

    def setup(self):
        type(self).connections += 1
        super().setup()

    def _send(self, status, ctype, body: bytes):
        type(self).requests += 1
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, "application/json", b'{"object": "list", "data": [{"id": "m"}]}')
        else:
            self._send(404, "application/json", b'{"error": {"message": "no"}}')

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n, p = req["max_tokens"], len(req["prompt"])
        events = [chunk("a", lp=False) for _ in range(n)]
        body = {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}
        events += [chunk("", reason="length", lp=False, usage=body), DONE]
        self._send(200, "text/event-stream", "".join(events).encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def peer_like():
    _PeerLike.connections = _PeerLike.requests = 0
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PeerLike)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("peer_flags", [False, True])
def test_peer_flags_end_to_end(peer_like, peer_flags):
    flags = ["--usage-with-finish", "--no-keepalive"] if peer_flags else []
    r = bench(
        *("--base-url", peer_like, "--num-prompts", "6", "--max-concurrency", "1"),
        *("--input-len", "5", "--output-len", "3", "--ignore-eos", "--token-count", "usage"),
        *flags,
    )
    if peer_flags:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Successful requests:                             6" in r.stdout
        assert _PeerLike.connections == _PeerLike.requests >= 7  # one connection per request
    else:  # the strict default: usage belongs on a chunk of its own; connections are reused
        assert r.returncode == 1 and "failed: usage_misplaced" in r.stdout
        assert _PeerLike.connections < _PeerLike.requests


def test_each_request_in_flight_keeps_its_own_connection(peer_like):
    r = bench(
        *("--base-url", peer_like, "--num-prompts", "24", "--max-concurrency", "3"),
        *("--input-len", "5", "--output-len", "3", "--ignore-eos", "--token-count", "usage"),
        "--usage-with-finish",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # a client a lane, reused: 3 lanes + the client for /v1/models and /metrics
    assert _PeerLike.requests >= 25 and _PeerLike.connections <= 4


# -- bad input to the tool ------------------------------------------------------------------------


class _Html(http.server.BaseHTTPRequestHandler):
    def _reply(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"<html><body>not an API</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _reply

    def log_message(self, *args):
        pass


@pytest.fixture
def html_server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_unreachable_server_fails_fast():
    started = time.monotonic()
    r = bench("--base-url", f"http://127.0.0.1:{free_port()}", "--num-prompts", "2")
    assert r.returncode == 1 and time.monotonic() - started < 20
    assert "cannot reach" in _one_line(r.stderr)


def test_html_server_is_reported(html_server, tmp_path):
    r = bench("--base-url", html_server, "--num-prompts", "2")
    assert r.returncode == 1 and "not a model list" in _one_line(r.stderr)
    out = tmp_path / "html.json"
    r = bench(
        "--base-url", html_server, "--model", "m", "--num-prompts", "2", "--save-json", str(out)
    )
    assert r.returncode == 1 and "not_sse" in _one_line(r.stderr)
    summary = json.loads(out.read_text())["summary"]
    assert (summary["completed"], summary["failures"]) == (0, {"not_sse": 2})


def test_silent_server_times_out():
    with socket.socket() as s:  # accepts connections (backlog), never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        started = time.monotonic()
        r = bench("--base-url", f"http://127.0.0.1:{s.getsockname()[1]}", "--read-timeout", "1")
    assert r.returncode == 1 and time.monotonic() - started < 20
    assert "ReadTimeout" in _one_line(r.stderr)


@pytest.mark.parametrize(
    "flags",
    [["--num-prompts", "x"], ["--slo", "latency=3"], ["--input-len-range", "9"], ["--bogus"]],
)
def test_bad_flags_exit_2(flags):
    r = bench(*flags)
    assert r.returncode == 2 and _one_line(r.stderr).startswith("bench_serve: error:")
