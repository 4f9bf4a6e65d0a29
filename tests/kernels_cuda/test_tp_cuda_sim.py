"""Tensor parallelism on the CUDA backend under numba's simulator: two ranks in worker
processes (executor/tp_backend and tp_worker: each a CudaModelRunner over ShardedCudaOps on its
shard, the collectives staged through the shared-memory communicator) give the TP = 1 CUDA
runner's greedy tokens, and its logprobs to float32 rounding (the row-parallel o and down sum
their halves in another order).

Tiny on purpose (the simulator runs each CUDA thread as a Python thread): one layer, hidden 16,
two q heads over one KV head (so each rank keeps a copy of the KV head: the replicated split),
a vocabulary of 32, two steps: a prompt step of two sequences whose ids fall in both vocab
shards, then a decode step that reads the sampled ids back from each rank's mirror.
"""

import numpy as np
import pytest

from vtllm.config import resolve
from vtllm.models import synthetic
from vtllm.models.loader import load_model
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams

pytestmark = pytest.mark.cudasim

# (architecture, hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, extra)
SHAPE = ("qwen3", 16, 1, 2, 1, 8, 16, 32, {})
MAX_MODEL_LEN = 16


def _plans() -> list[StepPlan]:
    params = SamplingParams(temperature=0, logprobs=5)
    seats = [
        SeatedRequest(0, [5, 20, 7], 3, params, 0, [1]),  # ids of rank 0's shard and rank 1's
        SeatedRequest(1, [30], 1, params, 0, [2]),
    ]
    prompt = [Chunk(0, 0, 3, [], True), Chunk(1, 0, 1, [], True)]
    decode = [Chunk(0, 3, 1, [], True), Chunk(1, 1, 1, [], True)]
    return [StepPlan(0, seats, prompt, []), StepPlan(1, [], decode, [])]


def _sampled(results) -> tuple[list[int], np.ndarray]:
    tokens = [s.token_id for r in results for s in r.sampled]
    logprobs = np.array([s.logprobs.top_logprobs for r in results for s in r.sampled])
    return tokens, logprobs


def test_two_cuda_ranks_give_tp1_tokens_and_logprobs(tmp_path, monkeypatch):
    from vtllm.executor.cuda_backend import runner_settings
    from vtllm.executor.cuda_runner import CudaModelRunner
    from vtllm.executor.tp_backend import TpBackend

    monkeypatch.setitem(synthetic.SHAPES, "tp-sim", SHAPE)
    loaded = load_model(synthetic.write_checkpoint(tmp_path, "tp-sim", seed=9))
    config, _ = resolve(
        device="cuda",
        tensor_parallel_size=2,
        cuda_graphs=False,  # capture needs the driver API, which the simulator lacks
        kv_cache_dtype="float32",
        matmul_input_dtype="float32",
        kv_cache_memory=1 << 16,
        block_size=4,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        max_model_len=MAX_MODEL_LEN,
    )
    backend = TpBackend(
        config,
        loaded,
        2,
        num_blocks=None,
        max_model_len=MAX_MODEL_LEN,
        threads=1,
        collective_timeout=120.0,
    )
    try:
        launched = [backend.launch(plan) for plan in _plans()]  # depth 2 on the ranks
        # TP = 1 here while the ranks compute
        runner = CudaModelRunner(loaded, **runner_settings(config, MAX_MODEL_LEN))
        tp1 = _sampled([runner.execute(plan) for plan in _plans()])
        tp2 = _sampled([backend.collect(step) for step in launched])
    finally:
        backend.close()
    assert tp2[0] == tp1[0]
    np.testing.assert_allclose(tp2[1], tp1[1], rtol=0, atol=1e-5)
