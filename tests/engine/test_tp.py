"""--tensor-parallel-size 2 on the CPU: two worker processes give the TP=1 greedy tokens on the
default model's goldens (tests/models/test_goldens.py asserts TP=1 gives these ids), and a
worker that dies makes the engine dead within the watchdog's beat, not a hang."""

import os
import signal
import subprocess
import sys
import time

import pytest

from vtllm import LLM, SamplingParams
from vtllm.engine.watchdog import Watchdog
from vtllm.errors import InvalidParameter

NUM_PROMPTS, NUM_TOKENS = 3, 16


@pytest.fixture(scope="module")
def tp_llm():
    llm = LLM(max_model_len=256, kv_cache_memory=32 << 20, tensor_parallel_size=2)
    yield llm
    started = time.monotonic()
    llm.close()
    assert time.monotonic() - started < 15  # a rank left alone is ended, not waited for


def test_tp2_greedy_tokens_are_tp1s(tp_llm, goldens):
    prompts = goldens["prompts"][:NUM_PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    outputs = tp_llm.generate([p["prompt_ids"] for p in prompts], params)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == prompt["output_ids"][:NUM_TOKENS], prompt["name"]


def test_killed_worker_makes_the_engine_dead_within_the_watchdog_beat(tp_llm):
    engine = tp_llm.engine
    deaths = []
    engine.on_dead = deaths.append
    timeout = 2.0  # the beat: timeout / 10, so well under a second
    watchdog = Watchdog(
        engine.loop, timeout, engine.die, call_soon_threadsafe=lambda f, *a: f(*a), grace=60
    )
    watchdog.start()
    try:
        worker = engine.backend._procs[1]
        os.kill(worker.pid, signal.SIGKILL)
        killed = time.monotonic()
        while not deaths and time.monotonic() - killed < timeout:
            time.sleep(0.02)
    finally:
        watchdog.stop()
    assert deaths and "worker 1" in deaths[0], deaths
    assert engine.dead is not None


def test_unsupported_settings_are_one_line_errors():
    # on cuda, more ranks than any host has GPUs (or no GPU, or no NCCL wheel: one line each)
    for n, settings in ((64, {"device": "cuda"}), (2, {"shadow_check_rate": 0.5})):
        with pytest.raises(InvalidParameter, match="tensor_parallel_size") as info:
            LLM(tensor_parallel_size=n, **settings)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("family", ["tiny-qwen3-moe", "device"])
def test_cli_refuses_in_one_line_and_exits_2(tmp_path, family):
    """An unsupported family (after it loads) or device (before): one line, exit code 2."""
    from vtllm.models.synthetic import write_checkpoint

    args = ["--device", "cuda"]
    if family != "device":
        args = [str(write_checkpoint(tmp_path, family, seed=1))]
    command = [sys.executable, "-m", "vtllm", "generate", *args, "--prompt", "x"]
    ranks = "64" if family == "device" else "2"  # 64: more than any host's GPUs
    r = subprocess.run(
        [*command, "--tensor-parallel-size", ranks], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "tensor" in errors[0], r.stderr


def test_workers_load_the_engines_model_and_match_tp1(tmp_path):
    """A model handed over in memory (LLM(loaded_model=...), no --model): the workers load its
    file, not the default model; a qwen3 (q/k norm) gives TP=1's greedy tokens at TP=2."""
    from vtllm.models.loader import load_model
    from vtllm.models.synthetic import write_checkpoint

    loaded = load_model(write_checkpoint(tmp_path, "tiny-qwen3", seed=5, peaked=True))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 9, 17, 3, 44], [7, 7, 100]]
    tokens = {}
    for n in (1, 2):
        llm = LLM(
            max_model_len=64, kv_cache_memory=4 << 20, tensor_parallel_size=n, loaded_model=loaded
        )
        try:
            tokens[n] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        finally:
            llm.close()
    assert tokens[2] == tokens[1]
