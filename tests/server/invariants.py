"""Scraping /metrics with labels, and the invariants every test re-checks after a fault:
no KV block, queue slot or task leaked, and every accepted request ended exactly once."""

import time

import httpx

GAUGES_AT_ZERO = (
    "vt:kv_cache_used_blocks",
    "vt:tracked_requests",
    "vt:num_requests_running",
    "vt:num_requests_waiting",
)


class Scrape(dict):
    """(name, ((label, value), ...)) -> value, the model_name label dropped."""

    def value(self, name: str, **labels) -> float:
        return self.get((name, tuple(sorted(labels.items()))), 0.0)

    def total(self, name: str) -> float:
        """Summed over every label set (histogram buckets excluded)."""
        return sum(v for (n, labels), v in self.items() if n == name and "le" not in dict(labels))


# One kept-alive connection for scraping: a fresh connection per scrape would add hypercorn
# tasks of its own that linger for seconds and hide (or fake) a leak.
scraper = httpx.Client(timeout=120)


def scrape(base: str) -> Scrape:
    out = Scrape()
    for line in scraper.get(base + "/metrics").text.splitlines():
        if not line or line.startswith("#"):
            continue
        sample, value = line.rsplit(" ", 1)
        name, _, rest = sample.partition("{")
        if name.endswith("_created"):
            continue
        labels = []
        for pair in filter(None, rest.rstrip("}").split(",")):
            key, _, val = pair.partition("=")
            if key != "model_name":
                labels.append((key, val.strip('"')))
        out[(name, tuple(sorted(labels)))] = float(value)
    return out


def ledger_balanced(m: Scrape) -> bool:
    """Every accepted request is either still tracked or ended once under a finish reason."""
    ended = m.total("vt:request_success_total")
    return m.value("vt:request_accepted_total") == ended + m.value("vt:tracked_requests")


def wait_invariants(base: str, *, tasks: float | None = None, timeout: float = 30.0) -> Scrape:
    """Wait until the server is idle and assert the invariants; `tasks`: the idle baseline of
    vt:event_loop_tasks (connection handlers of closed clients take a moment to go)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(base)
        idle = all(m.value(g) == 0 for g in GAUGES_AT_ZERO)
        settled = tasks is None or m.value("vt:event_loop_tasks") <= tasks
        if (idle and settled and ledger_balanced(m)) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for gauge in GAUGES_AT_ZERO:
        assert m.value(gauge) == 0, (gauge, m.value(gauge))
    assert ledger_balanced(m), (
        m.value("vt:request_accepted_total"),
        {k: v for k, v in m.items() if k[0] == "vt:request_success_total"},
    )
    if tasks is not None:
        assert m.value("vt:event_loop_tasks") <= tasks, (
            "leaked tasks",
            m.value("vt:event_loop_tasks"),
        )
    assert scraper.get(base + "/health").status_code == 200
    return m


def idle_tasks(base: str, steady: float = 1.0, timeout: float = 6.0) -> float:
    """The idle task count: the first value that holds for `steady` seconds (hypercorn keeps a
    closed connection's tasks for up to its 5 s keep-alive timeout, so a connection other than
    the scraper's shows as a count that is still falling)."""
    deadline = time.monotonic() + timeout
    count, since = scrape(base).value("vt:event_loop_tasks"), time.monotonic()
    while time.monotonic() - since < steady and time.monotonic() < deadline:
        time.sleep(0.1)
        now = scrape(base).value("vt:event_loop_tasks")
        if now != count:
            count, since = now, time.monotonic()
    return count
