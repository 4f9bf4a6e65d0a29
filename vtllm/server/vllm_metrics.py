"""vLLM's Prometheus names (`vllm:`) beside vtllm's own (`vt:`), so that a dashboard or
alert written for vLLM reads a vtllm server unchanged. docs/metrics.md maps each name to its
`vt:` twin and lists the vLLM metrics that have none here.

Label names and histogram buckets are vLLM's: `model_name` (the first served name) and
`engine` ("0": one engine per server). Timings follow vLLM's definitions, which differ from
the `vt:` ones in places: the prompt-token counter moves when a request's prompt has run (its
first token), not when it finishes; the request phases are observed when the request ends.
"""

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

LABELS = ("model_name", "engine")
ENGINE = "0"
FINISH_REASONS = ("stop", "length", "abort", "error")  # vLLM's, shown from the start at 0

_TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
_TOKEN_GAP_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
_REQUEST_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0),
    *(30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
_N_BUCKETS = (1, 2, 5, 10, 20)


def spec_decode_families(prefix: str, stats, label_names: list[str], label_values: list[str]):
    """Speculative decoding's counters as vLLM names them (`<prefix>spec_decode_*`), from the
    scheduler's SpecStats; nothing when speculation is off (stats None)."""
    if stats is None:
        return
    counts = {
        "num_drafts": ("speculative chunks verified", stats.num_drafts),
        "num_draft_tokens": ("proposed tokens verified", stats.num_draft_tokens),
        "num_accepted_tokens": ("proposed tokens accepted", stats.num_accepted_tokens),
    }
    for name, (doc, value) in counts.items():
        family = CounterMetricFamily(f"{prefix}spec_decode_{name}", doc, labels=label_names)
        family.add_metric(label_values, value)
        yield family
    family = CounterMetricFamily(
        f"{prefix}spec_decode_num_accepted_tokens_per_pos",
        "proposed tokens accepted, by position in the proposal (0 = first)",
        labels=[*label_names, "position"],
    )
    for position, value in enumerate(stats.accepted_per_pos):
        family.add_metric([*label_values, str(position)], value)
    yield family


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value: vLLM's buckets of token counts."""
    out, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return out
            out.append(mantissa * scale)
        scale *= 10


class VllmMetrics:
    """Fed by MetricsObserver's hooks (same arguments) and read at each scrape."""

    def __init__(self, registry, model_name: str, max_model_len: int):
        self.values = {"model_name": model_name, "engine": ENGINE}
        self.state = None  # the server state, set at each scrape for the scheduler's counters

        def make(kind, name, doc, **kw):
            return kind(name, doc, LABELS, registry=registry, **kw).labels(**self.values)

        def histogram(name, doc, buckets):
            return make(Histogram, name, doc, buckets=buckets)

        self.running = make(Gauge, "vllm:num_requests_running", "requests in the running batch")
        self.waiting = make(Gauge, "vllm:num_requests_waiting", "requests waiting to be run")
        self.kv_usage = make(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage, 1 is all")
        self.gpu_kv_usage = make(  # the name before vLLM 0.9; older dashboards read it
            Gauge, "vllm:gpu_cache_usage_perc", "KV-cache usage, 1 is all (old name)"
        )
        self.prompt_tokens = make(Counter, "vllm:prompt_tokens", "prefill tokens processed")
        self.generation_tokens = make(
            Counter, "vllm:generation_tokens", "generation tokens processed"
        )
        success = Counter(
            "vllm:request_success",
            "finished requests by finish reason",
            [*LABELS, "finished_reason"],
            registry=registry,
        )
        self.success = {r: success.labels(**self.values, finished_reason=r) for r in FINISH_REASONS}
        self._success = success
        token_counts = buckets_1_2_5(max_model_len)
        self.prompt_hist = histogram(
            "vllm:request_prompt_tokens", "prompt tokens per request", token_counts
        )
        self.generation_hist = histogram(
            "vllm:request_generation_tokens", "generated tokens per request", token_counts
        )
        self.max_tokens = histogram(
            "vllm:request_params_max_tokens", "the max_tokens request parameter", token_counts
        )
        self.n = histogram("vllm:request_params_n", "the n request parameter", _N_BUCKETS)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "time to first token", _TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "time between tokens", _TOKEN_GAP_BUCKETS
        )
        self.tpot = histogram(  # vLLM's older name of the same observations
            "vllm:time_per_output_token_seconds", "time between tokens (old)", _TOKEN_GAP_BUCKETS
        )
        self.request_tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "a request's decode time per output token after the first",
            _TOKEN_GAP_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "arrival to finish", _REQUEST_BUCKETS
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds", "time waiting to be scheduled", _REQUEST_BUCKETS
        )
        self.inference = histogram(
            "vllm:request_inference_time_seconds", "first scheduling to finish", _REQUEST_BUCKETS
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds", "first scheduling to first token", _REQUEST_BUCKETS
        )
        self.decode = histogram(
            "vllm:request_decode_time_seconds", "first token to finish", _REQUEST_BUCKETS
        )
        registry.register(_SchedulerCounters(self))

    def on_added(self, tracked) -> None:
        # One engine request a choice; vLLM's n is per request: counted on its first choice
        # (Engine.submit names choices <id>-<prompt>-<k>).
        if tracked.request.request_id.endswith("-0"):
            self.n.observe(tracked.request.sampling.n)

    def on_tokens(self, tracked, n: int, now: float) -> None:
        self.generation_tokens.inc(n)
        if tracked.last_token_at == 0.0:
            self.ttft.observe(now - tracked.added_at)
            self.prompt_tokens.inc(len(tracked.request.prompt_token_ids))
        else:
            gap = (now - tracked.last_token_at) / n
            for _ in range(n):
                self.itl.observe(gap)
                self.tpot.observe(gap)

    def on_finish(self, tracked, delta, now: float) -> None:
        reason = delta.finish_reason
        counter = self.success.get(reason)
        if counter is None:  # a reason vLLM does not have: shown under its own label
            counter = self._success.labels(**self.values, finished_reason=str(reason))
        counter.inc()
        self.e2e.observe(now - tracked.added_at)
        request = tracked.request
        self.prompt_hist.observe(len(request.prompt_token_ids))
        generated = delta.num_output_tokens
        self.generation_hist.observe(generated)
        if request.sampling.max_tokens:
            self.max_tokens.observe(request.sampling.max_tokens)
        if tracked.scheduled_at:
            self.queue.observe(tracked.scheduled_at - tracked.added_at)
            self.inference.observe(now - tracked.scheduled_at)
        if tracked.first_token_at:
            decode = now - tracked.first_token_at
            if tracked.scheduled_at:
                self.prefill.observe(tracked.first_token_at - tracked.scheduled_at)
            self.decode.observe(decode)
            self.request_tpot.observe(decode / (generated - 1) if generated > 1 else 0.0)

    def scrape(self, state, usage: float) -> None:
        scheduler = state.engine.scheduler
        self.running.set(scheduler.num_running)
        self.waiting.set(scheduler.num_waiting)
        self.kv_usage.set(usage)
        self.gpu_kv_usage.set(usage)
        self.state = state


class _SchedulerCounters:
    """Counters the scheduler keeps itself, under vLLM's names, read when scraped."""

    def __init__(self, metrics: VllmMetrics):
        self.metrics = metrics

    def collect(self):
        state = self.metrics.state
        if state is None:
            return
        scheduler = state.engine.scheduler
        values = {
            "vllm:num_preemptions": ("preemptions", scheduler.num_preemptions),
            "vllm:prefix_cache_queries": (
                "prefix cache queries, in prompt tokens",
                scheduler.pool.num_query_tokens,
            ),
            "vllm:prefix_cache_hits": (
                "prefix cache hits, in prompt tokens",
                scheduler.pool.num_hit_tokens,
            ),
        }
        labels = [self.metrics.values[k] for k in LABELS]
        for name, (doc, value) in values.items():
            family = CounterMetricFamily(name, doc, labels=list(LABELS))
            family.add_metric(labels, value)
            yield family
        yield from spec_decode_families("vllm:", scheduler.spec_stats, list(LABELS), labels)
