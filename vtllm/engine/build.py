"""Composition: load the model, size the KV cache, and wire scheduler, runner and backend."""

import logging
import os
import time

from vtllm.config import EngineConfig
from vtllm.errors import InvalidParameter
from vtllm.executor.backend import CpuBackend, cpu_ops
from vtllm.executor.cuda_backend import resolved_dtype
from vtllm.executor.host_memory import release_start_pages
from vtllm.executor.kv_cache import (
    allocate_kv_cache,
    free_host_memory,
    num_kv_blocks,
    resident_kv_blocks,
)
from vtllm.executor.runner import ModelRunner
from vtllm.models.loader import LoadedModel, load_model
from vtllm.scheduler.config import SchedulerConfig
from vtllm.scheduler.scheduler import Scheduler
from vtllm.scheduler.sliding_window import window_of_every_layer

__all__ = ["build_parts", "resolved_dtype", "set_cpu_threads"]

log = logging.getLogger("vtllm.engine")


def set_cpu_threads(requested: int) -> int:
    import numba

    threads = requested or len(os.sched_getaffinity(0))
    threads = max(1, min(threads, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(threads)
    return threads


def build_parts(
    config: EngineConfig, loaded: LoadedModel | None = None, *, phases: dict | None = None
):
    """Returns (loaded model, scheduler, backend, max_model_len). `phases` gets the seconds
    of each start-up phase by name (load, compile, KV allocation; on cuda, GPU set-up)."""
    phases = {} if phases is None else phases
    spec = config.speculative
    if config.data_parallel_size > 1:  # the replicas are whole servers (cli/data_parallel)
        raise InvalidParameter(
            f"data_parallel_size {config.data_parallel_size} runs under `vtllm serve` only",
            param="data_parallel_size",
        )
    if config.distributed_executor_backend == "ray":  # a missing extra fails before the load
        from vtllm.executor.ray_cluster import import_ray

        import_ray()
    elif config.device == "cuda" and config.tensor_parallel_size > 1:  # GPUs and NCCL, too
        from vtllm.executor.tp_backend import check_gpu_ranks

        check_gpu_ranks(config.tensor_parallel_size)
    started = time.perf_counter()
    # FP8 stays FP8 on one GPU (kernels/cuda/_fp8); tensor-parallel ranks load their own copy
    one_gpu = config.device == "cuda" and config.tensor_parallel_size == 1
    fp8_rows = one_gpu and config.distributed_executor_backend != "ray"
    loaded = loaded or load_model(config.model, fp8_rows=fp8_rows)
    phases["load"] = time.perf_counter() - started
    log.info(
        "model %s: %.1f MiB of weights loaded in %.1fs",
        loaded.name,
        loaded.weights.nbytes / (1 << 20),
        phases["load"],
    )
    mc = loaded.config
    max_model_len = min(config.max_model_len, mc.max_position_embeddings)
    resident_blocks = 0  # the GPU cache is allocated up front: no cap on what stays cached
    if config.tensor_parallel_size > 1 or config.distributed_executor_backend == "ray":
        backend_started = time.perf_counter()
        backend, num_blocks = _tp_backend(config, loaded, max_model_len)
        if config.device == "cpu":
            resident_blocks = _cpu_resident_blocks(config, loaded, max_model_len, num_blocks)
        else:
            phases["GPU set-up"] = time.perf_counter() - backend_started
    elif config.device == "cuda":
        backend_started = time.perf_counter()
        backend, num_blocks = _cuda_backend(config, loaded, max_model_len)
        phases["GPU set-up"] = time.perf_counter() - backend_started
    else:
        backend, num_blocks = _cpu_backend(config, loaded, max_model_len, phases)
        resident_blocks = _cpu_resident_blocks(config, loaded, max_model_len, num_blocks)
    proposer = None
    if spec is not None and spec.method == "draft_model":
        from vtllm.engine.speculative_draft import draft_proposer

        proposer = draft_proposer(
            spec.model,
            loaded,
            cpu_ops(config.cpu_numerics),
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_model_len=max_model_len,
        )
    scheduler = Scheduler(
        SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=max(config.max_num_batched_tokens, 1),
            max_model_len=max_model_len,
            block_size=config.block_size,
            num_blocks=num_blocks,
            enable_prefix_caching=config.enable_prefix_caching,
            resident_blocks=resident_blocks,
            eos_token_ids=mc.eos_token_ids,
            sliding_window=window_of_every_layer(
                mc.sliding_window, mc.sliding_layers, max_model_len
            ),
            num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
            prompt_lookup_min=spec.prompt_lookup_min if spec else 1,
            prompt_lookup_max=spec.prompt_lookup_max if spec else 1,
            speculative_disable_by_batch_size=spec.disable_by_batch_size if spec else 0,
        ),
        proposer,
    )
    return loaded, scheduler, backend, max_model_len


def _cpu_backend(config: EngineConfig, loaded: LoadedModel, max_model_len: int, phases: dict):
    started = time.perf_counter()
    ops = cpu_ops(config.cpu_numerics)  # compiles the kernels, or loads them from numba's cache
    phases["compile"] = time.perf_counter() - started
    release_start_pages("kernel table loaded")  # before the warm-up maps the weights back in
    if config.kv_cache_dtype == "bfloat16":  # auto is float32 here
        raise InvalidParameter(
            "kv_cache_dtype bfloat16 runs on the cuda device only; the cpu backend stores float32",
            param="kv_cache_dtype",
        )
    if config.matmul_input_dtype == "bfloat16":
        raise InvalidParameter(
            "matmul_input_dtype bfloat16 runs on the cuda device only",
            param="matmul_input_dtype",
        )
    threads = set_cpu_threads(config.cpu_threads)
    started = time.perf_counter()
    num_blocks = num_kv_blocks(
        loaded.config,
        block_size=config.block_size,
        budget_bytes=config.kv_cache_memory,
        fraction=config.kv_cache_fraction,
        free_bytes=free_host_memory(),
    )
    kv = allocate_kv_cache(loaded.config, num_blocks, config.block_size)
    phases["KV allocation"] = time.perf_counter() - started
    runner = ModelRunner(
        loaded, ops, kv, max_num_seqs=config.max_num_seqs, max_model_len=max_model_len
    )
    return CpuBackend(runner, threads=threads), num_blocks


def _tp_backend(config: EngineConfig, loaded: LoadedModel, max_model_len: int):
    """N worker processes or Ray actors (executor/tp_backend, ray_backend). On the CPU the
    block count is the full model's (the ranks' caches together hold what one process's
    would), so every rank's table is one; on GPUs each rank sizes its cache from its own
    memory (kv_cache_memory and kv_cache_fraction are per GPU) and the least count serves."""
    from vtllm.executor.tp_backend import build_tp_backend

    if config.device == "cuda":
        threads = set_cpu_threads(config.cpu_threads)
        backend = build_tp_backend(config, loaded, max_model_len, num_blocks=None, threads=threads)
        return backend, backend.num_blocks
    num_blocks = num_kv_blocks(
        loaded.config,
        block_size=config.block_size,
        budget_bytes=config.kv_cache_memory,
        fraction=config.kv_cache_fraction,
        free_bytes=free_host_memory(),
    )
    threads = set_cpu_threads(config.cpu_threads)
    backend = build_tp_backend(
        config, loaded, max_model_len, num_blocks=num_blocks, threads=threads
    )
    return backend, num_blocks


def _cpu_resident_blocks(
    config: EngineConfig, loaded: LoadedModel, max_model_len: int, num_blocks: int
) -> int:
    """The block pool's resident cap (0: none) on the CPU, where KV pages commit as written."""
    cap = resident_kv_blocks(
        loaded.config,
        block_size=config.block_size,
        budget_bytes=config.kv_cache_resident_memory,
        max_model_len=max_model_len,
    )
    if cap >= num_blocks - 1:
        return 0
    log.info("KV cache: cached prefixes evicted past %d resident blocks", cap)
    return cap


def _cuda_backend(config: EngineConfig, loaded: LoadedModel, max_model_len: int):
    from vtllm.executor.cuda_backend import CudaBackend, capture_graphs, runner_settings
    from vtllm.executor.cuda_runner import CudaModelRunner

    if config.shadow_check_rate > 0:
        raise InvalidParameter(
            "shadow checks run on the CPU backend only", param="shadow_check_rate"
        )

    def make_runner():
        runner = CudaModelRunner(loaded, **runner_settings(config, max_model_len))
        if config.cuda_graphs:
            capture_graphs(runner)
        return runner

    backend = CudaBackend(make_runner)
    return backend, backend.runner.num_blocks
