"""GET /metrics: Prometheus metrics named after vLLM's, under a `vt:` prefix.

Counters and histograms are fed by the step loop through `MetricsObserver`; gauges are read
from the scheduler when scraped. Each server has its own registry.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from starlette.requests import Request
from starlette.responses import Response

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)
_ITL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)


class MetricsObserver:
    def __init__(self, model_name: str):
        self.registry = registry = CollectorRegistry()
        labels = ["model_name"]
        self.labels = {"model_name": model_name}

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=registry).labels(**self.labels)

        self.running = gauge("vt:num_requests_running", "requests holding a slot")
        self.waiting = gauge("vt:num_requests_waiting", "requests queued")
        self.kv_usage = gauge("vt:kv_cache_usage_perc", "share of KV blocks in use (0..1)")
        self.kv_used = gauge("vt:kv_cache_used_blocks", "KV blocks in use")
        self.tracked = gauge("vt:tracked_requests", "requests the step loop still serves")
        self.state = None  # set by scrape(); the counters below read the scheduler then
        registry.register(_SchedulerCounters(self))
        self.prompt_tokens = Counter(
            "vt:prompt_tokens", "prompt tokens of finished requests", labels, registry=registry
        ).labels(**self.labels)
        self.generation_tokens = Counter(
            "vt:generation_tokens", "tokens generated", labels, registry=registry
        ).labels(**self.labels)
        self.success = Counter(
            "vt:request_success",
            "finished requests by finish reason",
            [*labels, "finished_reason"],
            registry=registry,
        )
        self.ttft = Histogram(
            "vt:time_to_first_token_seconds",
            "arrival to first token",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        ).labels(**self.labels)
        self.itl = Histogram(
            "vt:inter_token_latency_seconds",
            "time between tokens",
            labels,
            buckets=_ITL_BUCKETS,
            registry=registry,
        ).labels(**self.labels)
        self.e2e = Histogram(
            "vt:e2e_request_latency_seconds",
            "arrival to finish",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        ).labels(**self.labels)

    def on_tokens(self, tracked, n: int, now: float) -> None:
        self.generation_tokens.inc(n)
        if tracked.last_token_at == 0.0:
            self.ttft.observe(now - tracked.added_at)
        else:  # tokens that arrive together share the gap
            gap = (now - tracked.last_token_at) / n
            for _ in range(n):
                self.itl.observe(gap)

    def on_finish(self, tracked, update, now: float) -> None:
        self.e2e.observe(now - tracked.added_at)
        self.prompt_tokens.inc(len(tracked.request.prompt_token_ids))
        self.success.labels(**self.labels, finished_reason=update.finish_reason).inc()

    def scrape(self, state) -> bytes:
        scheduler = state.loop.scheduler
        pool = scheduler.pool
        self.running.set(scheduler.num_running)
        self.waiting.set(scheduler.num_waiting)
        self.kv_used.set(scheduler.num_used_blocks)
        self.kv_usage.set(scheduler.num_used_blocks / max(pool.num_usable_blocks, 1))
        self.tracked.set(len(state.loop.tracked))
        self.state = state
        return generate_latest(self.registry)


class _SchedulerCounters:
    """Counters the scheduler keeps itself, exposed as Prometheus counters when scraped."""

    def __init__(self, observer: MetricsObserver):
        self.observer = observer

    def collect(self):
        state = self.observer.state
        if state is None:
            return
        scheduler = state.loop.scheduler
        values = {
            "vt:num_preemptions": ("preemptions", scheduler.num_preemptions),
            "vt:prefix_cache_queries": ("prompt tokens looked up", scheduler.pool.num_query_tokens),
            "vt:prefix_cache_hits": ("prompt tokens found cached", scheduler.pool.num_hit_tokens),
            "vt:num_steps": ("engine steps launched", state.loop.num_steps),
        }
        for name, (doc, value) in values.items():
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([state.model_name], value)
            yield family


async def metrics(request: Request) -> Response:
    state = request.app.state.vt
    body = state.loop.observer.scrape(state)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
