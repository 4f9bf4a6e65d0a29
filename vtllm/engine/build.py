"""Composition: load the model, size the KV cache, and wire scheduler, runner and backend."""

import logging
import os
import time

from vtllm.config import EngineConfig
from vtllm.executor.backend import CpuBackend
from vtllm.executor.kv_cache import allocate_kv_cache, free_host_memory, num_kv_blocks
from vtllm.executor.runner import ModelRunner
from vtllm.models.loader import LoadedModel, load_model
from vtllm.scheduler.config import SchedulerConfig
from vtllm.scheduler.scheduler import Scheduler

log = logging.getLogger("vtllm.engine")


def set_cpu_threads(requested: int) -> int:
    import numba

    threads = requested or len(os.sched_getaffinity(0))
    threads = max(1, min(threads, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(threads)
    return threads


def build_parts(config: EngineConfig, loaded: LoadedModel | None = None):
    """Returns (loaded model, scheduler, backend, max_model_len)."""
    from vtllm.kernels import cpu as ops

    started = time.perf_counter()
    threads = set_cpu_threads(config.cpu_threads)
    loaded = loaded or load_model(config.model)
    mc = loaded.config
    max_model_len = min(config.max_model_len, mc.max_position_embeddings)
    num_blocks = num_kv_blocks(
        mc,
        block_size=config.block_size,
        budget_bytes=config.kv_cache_memory,
        fraction=config.kv_cache_fraction,
        free_bytes=free_host_memory(),
    )
    kv = allocate_kv_cache(mc, num_blocks, config.block_size)
    runner = ModelRunner(
        loaded, ops, kv, max_num_seqs=config.max_num_seqs, max_model_len=max_model_len
    )
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=max(config.max_num_batched_tokens, 1),
            max_model_len=max_model_len,
            block_size=config.block_size,
            num_blocks=num_blocks,
            enable_prefix_caching=config.enable_prefix_caching,
            eos_token_ids=mc.eos_token_ids,
        )
    )
    log.info(
        "model %s loaded: %.1f MiB of weights, ready in %.1fs",
        loaded.name,
        loaded.weights.nbytes / (1 << 20),
        time.perf_counter() - started,
    )
    return loaded, scheduler, CpuBackend(runner, threads=threads), max_model_len
