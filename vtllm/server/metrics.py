"""GET /metrics in Prometheus text format, names after vLLM's under a `vt:` prefix.

A first set of gauges read straight from the scheduler; histograms come later.
"""

from starlette.requests import Request
from starlette.responses import Response


def _lines(state) -> list[str]:
    scheduler = state.loop.scheduler
    pool = scheduler.pool
    usable = max(pool.num_usable_blocks, 1)
    model = f'model_name="{state.model_name}"'
    gauges = {
        "vt:num_requests_running": scheduler.num_running,
        "vt:num_requests_waiting": scheduler.num_waiting,
        "vt:kv_cache_usage_perc": scheduler.num_used_blocks / usable,
        "vt:kv_cache_used_blocks": scheduler.num_used_blocks,
        "vt:num_preemptions_total": scheduler.num_preemptions,
        "vt:prefix_cache_queries_total": pool.num_query_tokens,
        "vt:prefix_cache_hits_total": pool.num_hit_tokens,
        "vt:num_steps_total": state.loop.num_steps,
        "vt:tracked_requests": len(state.loop.tracked),
    }
    out = []
    for name, value in gauges.items():
        kind = "counter" if name.endswith("_total") else "gauge"
        out += [f"# TYPE {name} {kind}", f"{name}{{{model}}} {value}"]
    return out


async def metrics(request: Request) -> Response:
    body = "\n".join(_lines(request.app.state.vt)) + "\n"
    return Response(body, media_type="text/plain; version=0.0.4")
