"""--data-parallel-size 2: two replica servers behind one endpoint (processes of this host, or
spawned by Ray actors of a local cluster). Concurrent requests spread over both replicas, each
answer is what one engine gives, the metrics are the replicas' sums, and a replica that dies
makes the endpoint report dead and exit 3."""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from vtllm import LLM, SamplingParams

pytest.importorskip("ray", reason="the ray extra: make test-distributed runs these")

PROMPTS = [[5, 9, 17, 3, 44, i] for i in range(8)]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def one_engine_texts(tiny_model):
    llm = LLM(max_model_len=64, kv_cache_memory=4 << 20, loaded_model=tiny_model)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        return [o.outputs[0].text for o in llm.generate(PROMPTS, params)]
    finally:
        llm.close()


def _start(model_dir: Path, port: int, *flags, env=None) -> subprocess.Popen:
    command = [sys.executable, "-m", "vtllm", "serve", str(model_dir), "--port", str(port)]
    settings = ["--max-model-len", "64", "--kv-cache-memory", "8M", "--data-parallel-size", "2"]
    server = subprocess.Popen([*command, *settings, *flags], env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert server.poll() is None, "the server ended during its start"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    server.kill()
    raise AssertionError("the server did not start")


def _replica_pids(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    spawned = [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return [int(c) for c in spawned]  # not multiprocessing's resource tracker


def _serve_and_kill(server, port, kill_replica):
    url = f"http://127.0.0.1:{port}"

    def complete(prompt):
        body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.headers["x-vtllm-data-parallel-rank"], r.json()["choices"][0]["text"]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(complete, PROMPTS))
    assert {rank for rank, _ in answers} == {"0", "1"}  # both replicas served
    tokenized = httpx.post(f"{url}/tokenize", json={"prompt": "hello"})
    assert tokenized.status_code == 200, tokenized.text  # the other routes reach a replica too
    metrics = httpx.get(f"{url}/metrics").text
    generated = [ln for ln in metrics.splitlines() if ln.startswith("vt:generation_tokens_total")]
    assert generated and float(generated[0].split()[-1]) >= len(PROMPTS) * MAX_TOKENS
    kill_replica()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{url}/health").status_code == 503:
                break
        except httpx.TransportError:
            break
        time.sleep(0.1)
    assert server.wait(timeout=60) == 3
    return answers


def test_data_parallel_processes(tiny_model, tmp_path, one_engine_texts):
    port = 18400 + os.getpid() % 500
    server = _start(tiny_model.path, port)
    try:
        pids = _replica_pids(server.pid)
        assert len(pids) == 2
        answers = _serve_and_kill(server, port, lambda: os.kill(pids[1], signal.SIGKILL))
    finally:
        if server.poll() is None:
            server.kill()
    assert [text for _, text in answers] == one_engine_texts


def _ray_actor_pids(class_name: str) -> list[int]:
    """Ray titles an actor's process ray::ClassName."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().startswith(f"ray::{class_name}".encode()):
                pids.append(int(cmdline.parent.name))
        except OSError:
            pass
    return pids


def test_data_parallel_ray_actors(ray_cluster, tiny_model, one_engine_texts):
    """The replicas spawned by actors of the running cluster RAY_ADDRESS names."""
    port = 18900 + os.getpid() % 500
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}
    server = _start(tiny_model.path, port, "--distributed-executor-backend", "ray", env=env)
    try:
        actors = _ray_actor_pids("ReplicaActor")
        assert len(actors) == 2
        answers = _serve_and_kill(server, port, lambda: os.kill(actors[0], signal.SIGKILL))
    finally:
        if server.poll() is None:
            server.kill()
    assert [text for _, text in answers] == one_engine_texts
