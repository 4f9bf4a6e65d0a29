"""Drive a ModelRunner by hand: one request, teacher-forced, with a chosen chunking."""

import numpy as np

from vtllm.executor.kv_cache import allocate_kv_cache
from vtllm.executor.runner import ModelRunner
from vtllm.kernels import cpu as ops
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams


def make_runner(loaded, *, num_blocks=64, block_size=4, max_num_seqs=4, max_model_len=256):
    kv = allocate_kv_cache(loaded.config, num_blocks, block_size)
    return ModelRunner(loaded, ops, kv, max_num_seqs=max_num_seqs, max_model_len=max_model_len)


def teacher_forced_logits(runner, ids, chunk_sizes, *, slot=0, first_block=1) -> np.ndarray:
    """Logits at every position of `ids`, computed chunk by chunk (float32 [len(ids), vocab])."""
    bs = runner.block_size
    num_blocks = -(-len(ids) // bs)
    blocks = list(range(first_block, first_block + num_blocks))
    seat = SeatedRequest(slot, list(ids), len(ids), SamplingParams(temperature=0), 0, [])
    rows, start, given = [], 0, 0
    for step, size in enumerate(chunk_sizes):
        need = -(-(start + size) // bs)
        chunk = Chunk(slot, start, size, blocks[given:need], sample=False, prompt_logprobs=True)
        given = need
        plan = StepPlan(step, [seat] if step == 0 else [], [chunk], [])
        logits, *_ = runner.compute_logits(plan)
        rows.append(logits.copy())
        start += size
    assert start == len(ids)
    return np.concatenate(rows)
