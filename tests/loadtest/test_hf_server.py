"""loadtest/peers/hf_server.py end to end: bench_serve's strict checks pass against it, and its
left-padded batches give the same greedy tokens as requests run alone.

The server needs torch, transformers, starlette and uvicorn, which the project's own venv does
not have: it runs under $VTLLM_HF_PYTHON, else .venv-ref/bin/python, else this interpreter, and
the module is skipped when none of them can import those (as on CI).
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.server.conftest import ROOT, free_port

SERVER = ROOT / "loadtest" / "peers" / "hf_server.py"
BENCH = ROOT / "loadtest" / "bench_serve.py"
NEEDS = "import torch, transformers, starlette, uvicorn"


def _hf_python() -> str | None:
    for cand in (os.environ.get("VTLLM_HF_PYTHON"), ROOT / ".venv-ref/bin/python", sys.executable):
        if cand and os.path.exists(cand):
            probe = subprocess.run([str(cand), "-c", NEEDS], capture_output=True, timeout=120)
            if probe.returncode == 0:
                return str(cand)
    return None


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory):
    python = _hf_python()
    if python is None:
        pytest.skip("no interpreter with torch, transformers, starlette and uvicorn")
    model = tmp_path_factory.mktemp("hf") / "tiny"
    synth = [sys.executable, "-m", "vtllm", "synth", "--shape", "tiny", "--out", str(model)]
    subprocess.run(synth, check=True, capture_output=True, cwd=ROOT, timeout=60)
    port = free_port()
    cmd = [python, str(SERVER), "--model", str(model), "--port", str(port), "--device", "cpu"]
    # a wide gathering window, so requests sent together surely share a batch
    cmd += ["--max-batch", "4", "--batch-wait-ms", "200", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"hf_server did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)
    yield base
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


def test_bench_serve_verifies_every_request(hf_server, tmp_path):
    out = tmp_path / "run.json"
    flags = ["--base-url", hf_server, "--endpoint", "completions", "--num-prompts", "16"]
    flags += ["--input-len", "32", "--output-len", "16", "--ignore-eos", "--max-concurrency", "4"]
    flags += ["--token-range", "3:500", "--seed", "7", "--save-json", str(out)]  # vocab is 512
    r = subprocess.run(
        [sys.executable, str(BENCH), *flags], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(out.read_text())["summary"]
    assert (s["completed"], s["failed"], s["failures"]) == (16, 0, {})
    assert s["finish_reasons"] == {"length": 16}
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (16 * 32, 16 * 16)


def test_batched_greedy_matches_single_requests(hf_server):
    """Left padding, the attention mask and position ids must not change what a row computes."""
    prompts = [
        [3 + (i * 37 + k * 11) % 500 for k in range(n)] for i, n in enumerate((2, 19, 7, 40))
    ]

    def body(p):
        return {"prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 0}

    with httpx.Client(base_url=hf_server, timeout=60) as c:
        batches = c.get("/health").json()["batches"]
        alone = [c.post("/v1/completions", json=body(p)).json() for p in prompts]
        assert c.get("/health").json()["batches"] == batches + 4  # one batch per request

    async def together():
        async with httpx.AsyncClient(base_url=hf_server, timeout=60) as c:
            rs = await asyncio.gather(*(c.post("/v1/completions", json=body(p)) for p in prompts))
            return [r.json() for r in rs]

    with httpx.Client(base_url=hf_server, timeout=60) as c:
        batched = asyncio.run(together())
        assert c.get("/health").json()["batches"] == batches + 5  # all four in one batch
    for a, b, p in zip(alone, batched, prompts, strict=True):
        n = len(p)
        assert a["usage"] == {"prompt_tokens": n, "completion_tokens": 8, "total_tokens": n + 8}
        la, lb = a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]
        assert la["tokens"] == lb["tokens"], len(p)
        assert la["token_logprobs"] == pytest.approx(lb["token_logprobs"], abs=1e-4)


def test_bad_prompt_is_an_openai_error(hf_server):
    r = httpx.post(hf_server + "/v1/completions", json={"prompt": [1, 2, 10**6], "max_tokens": 2})
    assert r.status_code == 400 and "token ids" in r.json()["error"]["message"]
