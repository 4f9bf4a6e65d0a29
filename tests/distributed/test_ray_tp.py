"""--distributed-executor-backend ray: the tensor-parallel ranks as actors of a local Ray
cluster give TP=1's greedy tokens, and a killed actor makes the engine dead within the
watchdog's beat."""

import os
import signal
import time

import pytest

from vtllm import LLM, SamplingParams
from vtllm.engine.watchdog import Watchdog

PROMPTS = [[5, 9, 17, 3, 44], [7, 7, 100], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _llm(loaded, **settings) -> LLM:
    return LLM(max_model_len=64, kv_cache_memory=4 << 20, loaded_model=loaded, **settings)


@pytest.fixture(scope="module")
def tp1_tokens(tiny_model):
    llm = _llm(tiny_model)
    try:
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
    finally:
        llm.close()


@pytest.mark.parametrize("ranks", [2, 1])
def test_ray_ranks_give_tp1s_greedy_tokens(ray_cluster, tiny_model, tp1_tokens, ranks):
    llm = _llm(tiny_model, tensor_parallel_size=ranks, distributed_executor_backend="ray")
    try:
        tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
        assert type(llm.backend).__name__ == "RayTpBackend"
        assert len(llm.backend.pids) == ranks and os.getpid() not in llm.backend.pids
    finally:
        started = time.monotonic()
        llm.close()
        assert time.monotonic() - started < 15
    assert tokens == tp1_tokens
    deadline = time.monotonic() + 10  # the cluster frees the bundles on its own time
    while ray_cluster.available_resources().get("CPU") != 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray_cluster.available_resources().get("CPU") == 4  # actors and bundles given back


def test_killed_actor_makes_the_engine_dead_within_the_watchdog_beat(ray_cluster, tiny_model):
    llm = _llm(tiny_model, tensor_parallel_size=2, distributed_executor_backend="ray")
    engine = llm.engine
    deaths = []
    engine.on_dead = deaths.append
    timeout = 2.0  # the beat: timeout / 10
    watchdog = Watchdog(
        engine.loop, timeout, engine.die, call_soon_threadsafe=lambda f, *a: f(*a), grace=60
    )
    watchdog.start()
    try:
        os.kill(llm.backend.pids[1], signal.SIGKILL)
        killed = time.monotonic()
        while not deaths and time.monotonic() - killed < timeout:
            time.sleep(0.02)
    finally:
        watchdog.stop()
        llm.close()
    assert deaths and "actor 1" in deaths[0], deaths
    assert engine.dead is not None


def test_ranks_on_another_node_are_refused_in_one_line(ray_cluster):
    from vtllm.errors import InvalidParameter
    from vtllm.executor.ray_backend import RayTpBackend

    backend = RayTpBackend.__new__(RayTpBackend)  # only the placement check, no actors
    backend.ray = ray_cluster
    here = ray_cluster.get_runtime_context().get_node_id()
    backend._check_one_node([(here, 1), (here, 2)])
    with pytest.raises(InvalidParameter, match=r"tensor ranks \[1\] were placed on another node"):
        backend._check_one_node([(here, 1), ("f" * 56, 2)])
