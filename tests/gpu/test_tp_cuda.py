"""Tensor parallelism on real cards (executor/cuda_tp_ops, communicator_nccl).

On one GPU: NCCL at world size 1 inside the CUDA graphs. A CudaModelRunner over ShardedCudaOps
with an NcclCommunicator of one rank gives the plain runner's greedy tokens, steps replaying
their graphs; each of its graphs holds NCCL's all-gather (at one rank a device copy, so a
memcpy node: the plain runner's graphs have none), and the tokens depend on it: the sampler
reads the logits from the buffer that copy fills, so a replay without it would sample stale
rows. On two GPUs or more: TP = 2 against TP = 1, teacher-forced logits within the bf16 gate
(two ranks in two threads of this process, one GPU each), and greedy tokens through the
engine (two worker processes). Both skip, saying so, where fewer GPUs are visible.
    .venv/bin/python -m pytest -q -m gpu tests/gpu/test_tp_cuda.py
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.models.runner_util import teacher_forced_logits
from vtllm.models.loader import load_model
from vtllm.models.sharding import shard_weights
from vtllm.models.synthetic import write_checkpoint
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu

BLOCK, MAX_LEN, BLOCKS_PER_SEQ = 4, 64, 16  # 16 blocks of 4 tokens: a sequence's whole length
PROMPTS = ([5, 9, 17, 3, 44], [7, 7, 100], [300, 2, 81, 9, 9, 12, 40])
NEW_TOKENS = 24


def _nccl():
    try:
        import nvidia.nccl  # noqa: F401  (the nvidia-nccl-cu13 wheel: the cuda extra)
    except ImportError:
        pytest.skip("the nvidia-nccl-cu13 wheel is not installed (pip install 'vtllm[cuda]')")
    from vtllm.executor.communicator_nccl import NcclCommunicator

    return NcclCommunicator


def _gpus() -> int:
    from numba import cuda

    return len(cuda.gpus)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """bf16 weights with 16-aligned shapes (the tensor-core linears; one-token steps fold
    their norms on one GPU), peaked logits so that greedy paths are stable."""
    path = write_checkpoint(
        tmp_path_factory.mktemp("tp"), "tiny-qwen3", seed=3, bf16=True, peaked=True
    )
    return path, load_model(path)


def _runner(loaded, *, graphs: bool, **sharded):
    from vtllm.executor.cuda_runner import CudaModelRunner

    return CudaModelRunner(
        loaded,
        block_size=BLOCK,
        max_num_seqs=4,
        max_model_len=MAX_LEN,
        max_num_batched_tokens=32,
        kv_cache_memory=16 << 20,
        kv_cache_fraction=0.0,
        use_graphs=graphs,
        **sharded,
    )


def _greedy(runner) -> list[list[int]]:
    """Each prompt's greedy continuation, stepped by hand: one prompt step, then one-token
    steps of every sequence; each step's ids come from the device mirror the sampler wrote."""
    params = SamplingParams(temperature=0)
    seats = [
        SeatedRequest(s, p, len(p), params, 0, [1 + BLOCKS_PER_SEQ * s + i for i in range(16)])
        for s, p in enumerate(PROMPTS)
    ]
    chunks = [Chunk(s, 0, len(p), [], True) for s, p in enumerate(PROMPTS)]
    out = [[] for _ in PROMPTS]
    for step in range(NEW_TOKENS):
        result = runner.execute(StepPlan(step, seats if step == 0 else [], chunks, []))
        for sampled in result.sampled:
            out[sampled.slot].append(sampled.token_id)
        chunks = [Chunk(s, len(p) + step, 1, [], True) for s, p in enumerate(PROMPTS)]
    return out


def _memcpy_nodes(graph) -> int:
    from vtllm.executor.cuda_graphs import _driver, _ok

    driver = _driver()
    nodes, _count = _ok(driver.cuGraphGetNodes(graph._graph, graph.num_nodes), "cuGraphGetNodes")
    memcpy = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY
    return sum(_ok(driver.cuGraphNodeGetType(n), "cuGraphNodeGetType") == memcpy for n in nodes)


def test_nccl_at_world_size_one_inside_graphs_gives_tp1_tokens(tiny, monkeypatch):
    from vtllm.executor.cuda_graphs import CudaGraph

    communicator = _nccl()
    _, loaded = tiny
    replays = []
    replay = CudaGraph.replay
    monkeypatch.setattr(CudaGraph, "replay", lambda g: (replays.append(g), replay(g))[1])

    plain = _runner(loaded, graphs=True)
    plain.capture_all()
    expected = _greedy(plain)
    assert all(_memcpy_nodes(g) == 0 for g in plain.graphs.values())
    plain.close()

    replays.clear()
    comm = communicator(communicator.unique_id(), 0, 1)
    shard = shard_weights(loaded.config, loaded.weights, 0, 1)
    sharded = _runner(loaded, graphs=True, shard=shard, comm=comm)
    assert not sharded.programmatic_graphs  # no programmatic edge beside NCCL's work
    sharded.capture_all()
    assert sharded.graphs and all(_memcpy_nodes(g) >= 1 for g in sharded.graphs.values())
    replays.clear()  # the captures' own replays
    got = _greedy(sharded)
    assert len(replays) >= NEW_TOKENS, "every step of this workload fits a graph"
    assert all(g in sharded.graphs.values() for g in replays)
    sharded.close()
    comm.close()
    assert got == expected


def _tp2_logits(loaded, ids, communicator) -> list[np.ndarray]:
    """Teacher-forced logits of both ranks of TP = 2, each in a thread bound to its GPU."""
    from numba import cuda

    unique_id = communicator.unique_id()

    def rank(r):
        with cuda.gpus[r]:
            comm = communicator(unique_id, r, 2)  # returns once both ranks have joined
            shard = shard_weights(loaded.config, loaded.weights, r, 2)
            runner = _tp_runner(loaded, shard=shard, comm=comm)
            logits = teacher_forced_logits(runner, ids, [5, len(ids) - 5])
            runner.close()
            return logits

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(rank, range(2)))


def _tp_runner(loaded, **sharded):
    """bf16 KV and bf16 matmul inputs: the cuda defaults, the bf16 gate's subject."""
    from vtllm.executor.cuda_runner import CudaModelRunner

    return CudaModelRunner(
        loaded,
        block_size=BLOCK,
        max_num_seqs=4,
        max_model_len=MAX_LEN,
        max_num_batched_tokens=64,
        kv_cache_memory=16 << 20,
        kv_cache_fraction=0.0,
        use_graphs=False,
        kv_cache_dtype="bfloat16",
        matmul_input_dtype="bfloat16",
        **sharded,
    )


def test_tp2_teacher_forced_logits_within_the_bf16_gate(tiny):
    communicator = _nccl()
    if _gpus() < 2:
        pytest.skip(f"TP = 2 needs two GPUs; numba.cuda sees {_gpus()}")
    _, loaded = tiny
    ids = np.random.default_rng(1).integers(3, loaded.config.vocab_size, 40).tolist()
    expected = teacher_forced_logits(_tp_runner(loaded), ids, [5, len(ids) - 5])
    got = _tp2_logits(loaded, ids, communicator)
    np.testing.assert_array_equal(got[0], got[1])  # every rank samples from the same bits
    scale = np.abs(expected).max(axis=1, keepdims=True)
    rel = np.abs(got[0] - expected).max(axis=1, keepdims=True) / scale
    print(f"TP = 2 vs 1: max relative logit difference {rel.max():.2e}")
    assert rel.max() < 1e-2
    top2 = np.sort(expected, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2e-2 * scale[:, 0]
    assert clear.sum() > len(ids) // 2
    assert (got[0].argmax(1) == expected.argmax(1))[clear].all()


def test_tp2_greedy_tokens_through_the_engine_are_tp1s(tiny):
    from vtllm import LLM
    from vtllm import SamplingParams as Params

    _nccl()
    if _gpus() < 2:
        pytest.skip(f"TP = 2 needs two GPUs; numba.cuda sees {_gpus()}")
    path, loaded = tiny
    params = Params(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    tokens = {}
    for n in (1, 2):
        llm = LLM(
            str(path),
            device="cuda",
            tensor_parallel_size=n,
            max_model_len=MAX_LEN,
            max_num_seqs=4,
            kv_cache_memory=16 << 20,
            kv_cache_dtype="float32",
            matmul_input_dtype="float32",
        )
        try:
            outputs = llm.generate([list(p) for p in PROMPTS], params)
            tokens[n] = [o.outputs[0].token_ids for o in outputs]
        finally:
            llm.close()
    assert tokens[2] == tokens[1]


def test_killed_gpu_worker_makes_the_engine_dead(tiny):
    """As on CPU ranks (tests/engine/test_tp.py): a rank's process killed, the watchdog's beat
    finds it, the engine dies; closing ends the other rank within the join's 10 s."""
    import os
    import signal
    import time

    from vtllm import LLM
    from vtllm.engine.watchdog import Watchdog

    _nccl()
    if _gpus() < 2:
        pytest.skip(f"TP = 2 needs two GPUs; numba.cuda sees {_gpus()}")
    path, _ = tiny
    llm = LLM(
        str(path),
        device="cuda",
        tensor_parallel_size=2,
        max_model_len=MAX_LEN,
        max_num_seqs=4,
        kv_cache_memory=16 << 20,
    )
    try:
        engine, deaths = llm.engine, []
        engine.on_dead = deaths.append
        watchdog = Watchdog(
            engine.loop, 2.0, engine.die, call_soon_threadsafe=lambda f, *a: f(*a), grace=60
        )
        watchdog.start()
        try:
            os.kill(engine.backend._procs[1].pid, signal.SIGKILL)
            killed = time.monotonic()
            while not deaths and time.monotonic() - killed < 2.0:
                time.sleep(0.02)
        finally:
            watchdog.stop()
        assert deaths and "worker 1" in deaths[0], deaths
        assert engine.dead is not None
    finally:
        started = time.monotonic()
        llm.close()
    assert time.monotonic() - started < 15
