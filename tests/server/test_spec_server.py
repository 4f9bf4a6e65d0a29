"""A server started with --speculative-config serves, and /metrics counts the drafts under
vt: and vLLM's names (a tiny random checkpoint whose outputs cycle, so proposals hit)."""

import json
import signal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import start_server, wait_idle
from vtllm.models.synthetic import write_checkpoint

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3}  # fmt: skip
NAMES = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def _completion(base: str) -> list:
    body = {"model": "m", "prompt": [5, 9, 13, 5, 9, 13, 5], "max_tokens": 24,
            "temperature": 0, "ignore_eos": True, "logprobs": 1}  # fmt: skip
    response = httpx.post(base + "/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return [choice["text"], choice["logprobs"]["tokens"], choice["logprobs"]["token_logprobs"]]


def test_speculating_server_counts_drafts(tmp_path):
    model = write_checkpoint(tmp_path / "tiny", "tiny", seed=3, vocab=24, peaked=True)
    flags = ("--model", str(model), "--served-model-name", "m")
    outputs = []
    for extra in ((), ("--speculative-config", json.dumps(SPEC))):
        proc, base = start_server(*flags, *extra)
        try:
            outputs.append(_completion(base))
            wait_idle(base)
            text = httpx.get(base + "/metrics", timeout=60).text
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 0
    assert outputs[0] == outputs[1]  # greedy: the same text and logprobs either way
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for prefix in ("vt:", "vllm:"):
        values = {
            name: sum(s.value for s in families[f"{prefix}spec_decode_{name}"].samples)
            for name in NAMES
        }
        assert values["num_draft_tokens"] >= values["num_accepted_tokens"] > 0, values
        per_pos = families[f"{prefix}spec_decode_num_accepted_tokens_per_pos"].samples
        assert {s.labels["position"] for s in per_pos} >= {"0"}
        assert sum(s.value for s in per_pos) == values["num_accepted_tokens"]
