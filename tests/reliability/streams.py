"""A well-behaved streaming client that records its inter-token gaps, for the faults whose
promise is that other streams keep their pace (F6, F15)."""

import threading
import time

import httpx

PROBE = {
    "prompt": "Tell me a long story.",
    "max_tokens": 120,
    "ignore_eos": True,
    "temperature": 0.0,
    "stream": True,
}


def stream_gaps(base: str, body: dict = PROBE) -> list[float]:
    """Seconds between consecutive content frames of one stream, as the client sees them."""
    gaps, last = [], None
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
    assert len(gaps) >= body["max_tokens"] // 2, len(gaps)  # tokens may merge into a frame
    return gaps


def p99(gaps: list[float]) -> float:
    ordered = sorted(gaps)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


class Probe(threading.Thread):
    """stream_gaps in the background: start(), then join() and read .gaps."""

    def __init__(self, base: str, body: dict = PROBE):
        super().__init__(daemon=True)
        self.base, self.body, self.gaps = base, body, None
        self.first_token = threading.Event()

    def run(self):
        self.gaps = stream_gaps(self.base, self.body)

    def result(self, timeout: float = 120.0) -> list[float]:
        self.join(timeout)
        assert self.gaps is not None, "the probe stream did not finish"
        return self.gaps


def gap_bound(baseline: list[float]) -> float:
    """What 'unchanged' means on a shared 2-core machine: the p99 gap may at most double,
    plus 100 ms of scheduling noise. (The blockers of F15 made gaps of 0.5-3 s while they
    still ran on the event loop or held the GIL.)"""
    return 2.0 * p99(baseline) + 0.1
