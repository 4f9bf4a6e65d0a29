"""GET /metrics: Prometheus metrics named after vLLM's, under a `vt:` prefix, and vLLM's own
names beside them (vllm_metrics.py).

Counters and histograms are fed by the step loop through `MetricsObserver`; gauges are read
from the scheduler when scraped. Each server has its own registry.

Request phases follow vLLM: queue time is arrival to first scheduling, prefill time first
scheduling to first token, decode time first token to finish. Every accepted request
(vt:request_accepted_total) ends exactly once in vt:request_success_total under its
finished_reason (stop, length, abort, error); aborts are also counted by the phase they cut.
"""

import asyncio
from time import perf_counter, thread_time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from starlette.requests import Request
from starlette.responses import Response

from vtllm.scheduler.output import ABORT
from vtllm.server.vllm_metrics import VllmMetrics, spec_decode_families

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


_DISCONNECT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class MetricsObserver:
    def __init__(self, model_name: str, max_model_len: int = 4096):
        self.registry = registry = CollectorRegistry()
        self.vllm = VllmMetrics(registry, model_name, max_model_len)
        labels = ["model_name"]
        self.labels = {"model_name": model_name}

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=registry).labels(**self.labels)

        self.running = gauge("vt:num_requests_running", "requests holding a slot")
        self.waiting = gauge("vt:num_requests_waiting", "requests queued")
        self.kv_usage = gauge("vt:kv_cache_usage_perc", "share of KV blocks in use (0..1)")
        self.kv_used = gauge("vt:kv_cache_used_blocks", "KV blocks in use")
        self.kv_blocks = gauge("vt:kv_cache_num_blocks", "KV blocks requests can use")
        self.tracked = gauge("vt:tracked_requests", "requests the step loop still serves")
        self.tasks = gauge("vt:event_loop_tasks", "asyncio tasks alive (leaks show here)")
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

        def phase(name, doc):
            return Histogram(name, doc, labels, buckets=_LATENCY_BUCKETS, registry=registry).labels(
                **self.labels
            )

        self.queue_time = phase("vt:request_queue_time_seconds", "arrival to first scheduling")
        self.prefill_time = phase("vt:request_prefill_time_seconds", "scheduling to first token")
        self.decode_time = phase("vt:request_decode_time_seconds", "first token to finish")
        self.accepted = Counter(
            "vt:request_accepted", "requests the engine took in", labels, registry=registry
        ).labels(**self.labels)
        self.aborts = Counter(
            "vt:request_abort",
            "aborted requests by the phase they were in (queued, prefill, decode)",
            [*labels, "phase"],
            registry=registry,
        )
        self.write_stalls = Counter(
            "vt:request_write_stall",
            "streams aborted because their client read nothing for the write-stall timeout",
            labels,
            registry=registry,
        ).labels(**self.labels)
        self.disconnect_to_abort = Histogram(
            "vt:request_disconnect_to_abort_seconds",
            "from the server seeing a client disconnect to the engine freeing the request",
            labels,
            buckets=_DISCONNECT_BUCKETS,
            registry=registry,
        ).labels(**self.labels)

    def on_write_stall(self) -> None:
        self.write_stalls.inc()

    def on_added(self, tracked) -> None:
        self.accepted.inc()
        self.vllm.on_added(tracked)

    def on_scheduled(self, tracked, now: float) -> None:
        self.queue_time.observe(now - tracked.added_at)

    def on_tokens(self, tracked, n: int, now: float) -> None:
        self.vllm.on_tokens(tracked, n, now)
        self.generation_tokens.inc(n)
        if tracked.last_token_at == 0.0:
            self.ttft.observe(now - tracked.added_at)
            if tracked.scheduled_at:
                self.prefill_time.observe(now - tracked.scheduled_at)
        else:  # tokens that arrive together share the gap
            gap = (now - tracked.last_token_at) / n
            for _ in range(n):
                self.itl.observe(gap)

    def on_finish(self, tracked, delta, now: float) -> None:
        self.vllm.on_finish(tracked, delta, now)
        self.e2e.observe(now - tracked.added_at)
        if tracked.first_token_at:
            self.decode_time.observe(now - tracked.first_token_at)
        if delta.finish_reason == ABORT:
            if not tracked.scheduled_at:
                phase = "queued"
            elif not tracked.first_token_at:
                phase = "prefill"
            else:
                phase = "decode"
            self.aborts.labels(**self.labels, phase=phase).inc()
            if tracked.disconnected_at:
                self.disconnect_to_abort.observe(now - tracked.disconnected_at)
        self.prompt_tokens.inc(len(tracked.request.prompt_token_ids))
        self.success.labels(**self.labels, finished_reason=delta.finish_reason).inc()

    def scrape(self, state) -> bytes:
        scheduler = state.engine.scheduler
        pool = scheduler.pool
        self.running.set(scheduler.num_running)
        self.waiting.set(scheduler.num_waiting)
        self.kv_used.set(scheduler.num_used_blocks)
        self.kv_blocks.set(pool.num_usable_blocks)
        usage = scheduler.num_used_blocks / max(pool.num_usable_blocks, 1)
        self.kv_usage.set(usage)
        self.vllm.scrape(state, usage)
        self.tracked.set(state.engine.num_unfinished)
        self.tasks.set(len(asyncio.all_tasks()))
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
        scheduler, now = state.engine.scheduler, perf_counter()
        host, wait, idle = state.engine.loop.time_split(now)
        values = {
            "vt:num_preemptions": ("preemptions", scheduler.num_preemptions),
            "vt:prefix_cache_queries": ("prompt tokens looked up", scheduler.pool.num_query_tokens),
            "vt:prefix_cache_hits": ("prompt tokens found cached", scheduler.pool.num_hit_tokens),
            "vt:num_steps": ("engine steps launched", state.engine.loop.num_steps),
            # the step loop's clock and its parts, read together (a client's clock around
            # the scrape would add the scrape's own latency to the split)
            "vt:engine_seconds": (
                "seconds since the step loop was made",
                now - state.engine.loop.created_at,
            ),
            "vt:engine_host_seconds": (
                "seconds the step loop spent scheduling and delivering tokens",
                host,
            ),
            "vt:engine_wait_seconds": (
                "seconds the step loop awaited launched steps' results",
                wait,
            ),
            "vt:engine_idle_seconds": (
                "seconds the step loop had no request to step",
                idle,
            ),
            # the backend's side: when the device's seconds fall short of the loop's, the
            # device waited on the host (a launch's seconds include its waits for the GIL)
            "vt:engine_device_seconds": (
                "seconds the device spent running steps",
                state.engine.backend.device_seconds,
            ),
            "vt:engine_launch_seconds": (
                "seconds the backend's thread spent enqueuing steps on the device",
                state.engine.backend.launch_seconds,
            ),
            # the scrape runs on the event loop's thread: its CPU time beside the loop's clock
            # tells how near that thread (the step loop, HTTP, SSE) is to being the limit
            "vt:event_loop_cpu_seconds": (
                "CPU seconds of the event loop's thread",
                thread_time(),
            ),
        }
        for name, (doc, value) in values.items():
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([state.model_name], value)
            yield family
        stats = scheduler.spec_stats
        yield from spec_decode_families("vt:", stats, ["model_name"], [state.model_name])


async def metrics(request: Request) -> Response:
    state = request.app.state.vt
    body = state.engine.observer.scrape(state)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
