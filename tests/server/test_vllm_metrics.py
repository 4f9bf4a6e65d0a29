"""/metrics speaks vLLM's names too: a vLLM dashboard's queries find their series, with
vLLM's labels and buckets, and the counters move with the traffic."""

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import wait_idle
from vtllm.server.vllm_metrics import FINISH_REASONS

TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5]
TTFT += [5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5]
ITL += [10.0, 20.0, 40.0, 80.0]
REQUEST = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
REQUEST += [120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TOKENS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]  # up to the test server's 1024 context

# family -> (type, buckets or None)
EXPECTED = {
    "vllm:num_requests_running": ("gauge", None),
    "vllm:num_requests_waiting": ("gauge", None),
    "vllm:kv_cache_usage_perc": ("gauge", None),
    "vllm:gpu_cache_usage_perc": ("gauge", None),
    "vllm:prompt_tokens": ("counter", None),
    "vllm:generation_tokens": ("counter", None),
    "vllm:request_success": ("counter", None),
    "vllm:num_preemptions": ("counter", None),
    "vllm:prefix_cache_queries": ("counter", None),
    "vllm:prefix_cache_hits": ("counter", None),
    "vllm:time_to_first_token_seconds": ("histogram", TTFT),
    "vllm:inter_token_latency_seconds": ("histogram", ITL),
    "vllm:time_per_output_token_seconds": ("histogram", ITL),
    "vllm:request_time_per_output_token_seconds": ("histogram", ITL),
    "vllm:e2e_request_latency_seconds": ("histogram", REQUEST),
    "vllm:request_queue_time_seconds": ("histogram", REQUEST),
    "vllm:request_inference_time_seconds": ("histogram", REQUEST),
    "vllm:request_prefill_time_seconds": ("histogram", REQUEST),
    "vllm:request_decode_time_seconds": ("histogram", REQUEST),
    "vllm:request_prompt_tokens": ("histogram", TOKENS),
    "vllm:request_generation_tokens": ("histogram", TOKENS),
    "vllm:request_params_max_tokens": ("histogram", TOKENS),
    "vllm:request_params_n": ("histogram", [1, 2, 5, 10, 20]),
}


def _families(base: str) -> dict:
    text = httpx.get(base + "/metrics", timeout=60).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(family, suffix: str = "", **labels) -> float:
    return sum(
        s.value
        for s in family.samples
        if s.name == family.name + suffix and labels.items() <= s.labels.items()
    )


def test_vllm_names_labels_and_buckets_and_the_counters_move(server):
    wait_idle(server)
    before = _families(server)
    body = {"prompt": "Once upon a time", "max_tokens": 5, "ignore_eos": True}
    r = httpx.post(server + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200
    usage = r.json()["usage"]
    wait_idle(server)
    after = _families(server)
    model = r.json()["model"]
    for name, (kind, buckets) in EXPECTED.items():
        family = after[name]
        assert family.type == kind, name
        for sample in family.samples:
            assert sample.labels["model_name"] == model and sample.labels["engine"] == "0"
        if buckets is not None:
            bounds = [s.labels["le"] for s in family.samples if s.name.endswith("_bucket")]
            assert bounds == [*(str(float(b)) for b in buckets), "+Inf"], name
    reasons = {s.labels["finished_reason"] for s in after["vllm:request_success"].samples}
    assert reasons >= set(FINISH_REASONS)

    def moved(name, suffix="", **labels):
        return _value(after[name], suffix, **labels) - _value(before[name], suffix, **labels)

    assert moved("vllm:prompt_tokens", "_total") >= usage["prompt_tokens"]
    assert moved("vllm:generation_tokens", "_total") >= usage["completion_tokens"] == 5
    assert moved("vllm:request_success", "_total", finished_reason="length") >= 1
    assert moved("vllm:prefix_cache_queries", "_total") >= usage["prompt_tokens"]
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert moved(name, "_count") >= 1
    assert moved("vllm:inter_token_latency_seconds", "_count") >= 4
    assert moved("vllm:request_params_n", "_count") >= 1
    # beside the vt: names, which stay as they were
    assert "vt:request_success" in after and "vt:time_to_first_token_seconds" in after
