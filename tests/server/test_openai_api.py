"""A live server with the default model, driven by the official openai client and raw SSE."""

import json

import httpx
import openai
import pytest

from tests.server.conftest import metrics, wait_idle


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused")


def _sse_events(response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_openai_client_streams_chat(client, server):
    model = client.models.list().data[0].id
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        stream=True,
        temperature=0.0,
        max_tokens=24,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    wait_idle(server)


def test_openai_client_completion_matches_golden(client, server, goldens):
    golden = goldens["prompts"][0]
    out = client.completions.create(
        model=client.models.list().data[0].id,
        prompt=golden["prompt_ids"],
        max_tokens=64,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    expected = httpx.post(
        server + "/detokenize", json={"tokens": golden["output_ids"]}, timeout=120
    ).json()
    assert out.choices[0].text == expected["prompt"]
    assert out.usage.completion_tokens == 64 and out.choices[0].finish_reason == "length"


def test_raw_sse_frames_and_one_usage_chunk(server):
    body = {
        "prompt": "Once upon a time",
        "max_tokens": 12,
        "stream": True,
        "seed": 3,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(r)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    usage = [e for e in events[:-1] if e.get("usage")]
    assert len(usage) == 1 and usage[0] is events[-2] and usage[0]["choices"] == []
    text = "".join(e["choices"][0]["text"] for e in events[:-2])
    whole = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    plain = httpx.post(server + "/v1/completions", json=whole, timeout=120).json()
    assert text == plain["choices"][0]["text"]
    assert usage[0]["usage"] == plain["usage"]


def test_n_choices_and_logprobs(server):
    body = {
        "prompt": "The sky is",
        "max_tokens": 5,
        "n": 3,
        "seed": 1,
        "logprobs": 2,
        "temperature": 1.0,
    }
    out = httpx.post(server + "/v1/completions", json=body, timeout=120).json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for choice in out["choices"]:
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == 5
        assert all(len(t) <= 2 for t in lp["top_logprobs"])
    assert out["usage"]["prompt_tokens"] == len(
        httpx.post(server + "/tokenize", json={"prompt": "The sky is"}, timeout=120).json()[
            "tokens"
        ]
    )


def test_stop_string_is_not_sent(server):
    body = {"prompt": [1, 2, 3], "max_tokens": 40, "temperature": 0.0, "ignore_eos": True}
    full = httpx.post(server + "/v1/completions", json=body, timeout=120).json()["choices"][0][
        "text"
    ]
    stop = full[5:8]
    cut = httpx.post(server + "/v1/completions", json={**body, "stop": [stop]}, timeout=120).json()
    choice = cut["choices"][0]
    assert choice["text"] == full[: full.index(stop)]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    body = {"prompt": "Count to a thousand:", "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=120) as r:
        for i, _line in enumerate(r.iter_lines()):
            if i > 6:
                break
    m = wait_idle(server)
    assert m["vt:kv_cache_used_blocks"] == 0 and m["vt:tracked_requests"] == 0


def test_metrics_count_tokens_and_latencies(server):
    before = metrics(server)
    body = {"prompt": "Hello", "max_tokens": 7, "ignore_eos": True}
    httpx.post(server + "/v1/completions", json=body, timeout=120)
    after = metrics(server)
    assert after["vt:generation_tokens_total"] - before["vt:generation_tokens_total"] == 7
    assert after["vt:time_to_first_token_seconds_count"] == (
        before["vt:time_to_first_token_seconds_count"] + 1
    )
    assert after["vt:inter_token_latency_seconds_count"] >= (
        before["vt:inter_token_latency_seconds_count"] + 6
    )
    assert after["vt:e2e_request_latency_seconds_count"] == (
        before["vt:e2e_request_latency_seconds_count"] + 1
    )
    # the step loop's split of its time: its own work, and awaiting the steps' results
    assert after["vt:num_steps_total"] >= before["vt:num_steps_total"] + 7
    assert after["vt:engine_host_seconds_total"] > before["vt:engine_host_seconds_total"]
    assert after["vt:engine_wait_seconds_total"] > before["vt:engine_wait_seconds_total"]
    parts = ("host", "wait", "idle")
    spent = sum(
        after[f"vt:engine_{p}_seconds_total"] - before[f"vt:engine_{p}_seconds_total"]
        for p in parts
    )
    assert 0 < spent <= after["vt:engine_seconds_total"] - before["vt:engine_seconds_total"]
    # the backend's side: the CPU backend's steps are all device time, its launch only queues
    device = after["vt:engine_device_seconds_total"] - before["vt:engine_device_seconds_total"]
    assert 0 < device <= after["vt:engine_seconds_total"] - before["vt:engine_seconds_total"]
    assert after["vt:engine_launch_seconds_total"] == 0
    assert after["vt:event_loop_cpu_seconds_total"] > before["vt:event_loop_cpu_seconds_total"]


def test_streamed_logprob_offsets_continue_across_chunks(server):
    body = {
        "prompt": "The capital of France is",
        "max_tokens": 6,
        "logprobs": 0,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    whole = httpx.post(server + "/v1/completions", json=body, timeout=120).json()
    with httpx.stream(
        "POST", server + "/v1/completions", json={**body, "stream": True}, timeout=120
    ) as r:
        events = [e for e in _sse_events(r) if e != "[DONE]"]
    offsets = [o for e in events for o in e["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == whole["choices"][0]["logprobs"]["text_offset"]


def test_seeded_text_equals_the_offline_api(server):
    from vtllm import LLM, SamplingParams

    prompt = "Write a short poem about the sea."
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 1234}
    served = httpx.post(server + "/v1/completions", json=body, timeout=120).json()
    llm = LLM(max_model_len=1024, kv_cache_memory=32 << 20)
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=1234)
    offline = llm.generate(prompt, params)[0].outputs[0]
    llm.backend.close()
    assert served["choices"][0]["text"] == offline.text
