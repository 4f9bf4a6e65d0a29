"""Composition: load the model, size the KV cache, and wire scheduler, runner and backend."""

import logging
import os
import time

from vtllm.config import EngineConfig
from vtllm.errors import InvalidParameter
from vtllm.executor.backend import CpuBackend, cpu_ops
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
    started = time.perf_counter()
    loaded = loaded or load_model(config.model)
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
        backend, num_blocks = _tp_backend(config, loaded, max_model_len)
        resident_blocks = _cpu_resident_blocks(config, loaded, max_model_len, num_blocks)
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


def resolved_dtype(setting: str, device: str) -> str:
    """kv_cache_dtype / matmul_input_dtype as the backend takes it: auto is bfloat16 on cuda
    (what vLLM and llama.cpp run a 16-bit model with; a bf16 cache halves the bytes decode
    attention reads, and bf16 matmul inputs halve prefill's mmas: BENCHMARKS.md, GPU decode
    and prefill) and float32 on the cpu, whose kernels compute in float32 only."""
    if setting != "auto":
        return setting
    return "bfloat16" if device == "cuda" else "float32"


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
    """N CPU worker processes or Ray actors (executor/tp_backend, ray_backend). The block
    count is the full model's (the ranks' caches together hold what one process's would), so
    every rank's table is one."""
    from vtllm.executor.tp_backend import build_tp_backend

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
    from vtllm.executor.cuda_backend import CudaBackend
    from vtllm.executor.cuda_runner import CudaModelRunner

    if config.shadow_check_rate > 0:
        raise InvalidParameter(
            "shadow checks run on the CPU backend only", param="shadow_check_rate"
        )

    spec = config.speculative

    def make_runner():
        started = time.perf_counter()
        runner = CudaModelRunner(
            loaded,
            block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_model_len=max_model_len,
            max_num_batched_tokens=max(config.max_num_batched_tokens, 1),
            kv_cache_memory=config.kv_cache_memory,
            kv_cache_fraction=config.kv_cache_fraction,
            use_graphs=config.cuda_graphs,
            cuda_pdl=config.cuda_pdl,
            split_attention_rows=config.cuda_split_attention_rows,
            cuda_flash_prefill=config.cuda_flash_prefill,
            cuda_prefill_gemm=config.cuda_prefill_gemm,
            kv_cache_dtype=resolved_dtype(config.kv_cache_dtype, "cuda"),
            matmul_input_dtype=resolved_dtype(config.matmul_input_dtype, "cuda"),
            speculative_tokens=spec.num_speculative_tokens if spec else 0,
            speculative_max_batch=spec.disable_by_batch_size - 1 if spec else 0,
        )
        if config.cuda_graphs:
            from tqdm import tqdm

            with tqdm(total=len(runner.graph_keys), desc="CUDA graphs", leave=False) as bar:
                runner.capture_all(progress=lambda _key: bar.update(1))
            log.info(
                "CUDA graphs captured for steps of %s tokens, and with drafts of %s sequences, "
                "in %.1fs",
                runner.buckets,
                runner.spec_buckets,
                time.perf_counter() - started,
            )
        return runner

    backend = CudaBackend(make_runner)
    return backend, backend.runner.num_blocks
