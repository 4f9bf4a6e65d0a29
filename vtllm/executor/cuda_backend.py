"""The GPU backend: the same launch / collect contract as CpuBackend, over CudaModelRunner.

Every CUDA call runs on one worker thread (numba binds its context per thread, and one thread
keeps the stream's order obvious). `launch` returns as soon as the step is enqueued on the
GPU; `collect` waits for the step's event, queued behind the next step's launch, so with
depth 2 the GPU is already running step N+1 while the host reads step N's tokens.
"""

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from vtllm.executor.backend import InFlightStep
from vtllm.scheduler.plan import StepPlan, StepResult

log = logging.getLogger("vtllm.engine")


def resolved_dtype(setting: str, device: str) -> str:
    """kv_cache_dtype / matmul_input_dtype as the backend takes it: auto is bfloat16 on cuda
    (what vLLM and llama.cpp run a 16-bit model with; a bf16 cache halves the bytes decode
    attention reads, and bf16 matmul inputs halve prefill's mmas: BENCHMARKS.md, GPU decode
    and prefill) and float32 on the cpu, whose kernels compute in float32 only."""
    if setting != "auto":
        return setting
    return "bfloat16" if device == "cuda" else "float32"


def runner_settings(config, max_model_len: int) -> dict:
    """CudaModelRunner's keyword arguments from an EngineConfig (one GPU, or each rank's)."""
    spec = config.speculative
    return dict(
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
        cuda_kquant_tensor_cores=config.cuda_kquant_tensor_cores,
        kv_cache_dtype=resolved_dtype(config.kv_cache_dtype, "cuda"),
        matmul_input_dtype=resolved_dtype(config.matmul_input_dtype, "cuda"),
        speculative_tokens=spec.num_speculative_tokens if spec else 0,
        speculative_max_batch=spec.disable_by_batch_size - 1 if spec else 0,
    )


def capture_graphs(runner, what: str = "CUDA graphs", *, progress: bool = True) -> None:
    """Every graph of the runner, captured at start (with a progress bar), then logged."""
    started = time.perf_counter()
    if progress:
        from tqdm import tqdm

        with tqdm(total=len(runner.graph_keys), desc=what, leave=False) as bar:
            runner.capture_all(progress=lambda _key: bar.update(1))
    else:
        runner.capture_all()
    log.info(
        "%s captured for steps of %s tokens, and with drafts of %s sequences, in %.1fs",
        what,
        runner.buckets,
        runner.spec_buckets,
        time.perf_counter() - started,
    )


class CudaBackend:
    threads = 1  # host threads driving the device (reported like the CPU backend's)

    def __init__(self, make_runner):
        """make_runner() builds the CudaModelRunner; it runs on the worker thread."""
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vtllm-cuda")
        self.runner = self._worker.submit(make_runner).result()

    def call(self, fn, *args):
        """Runs fn(*args) on the worker thread (after the steps queued there) and waits."""
        return self._worker.submit(fn, *args).result()

    @property
    def device_seconds(self) -> float:
        return self.runner.device_seconds

    @property
    def launch_seconds(self) -> float:
        return self.runner.launch_seconds

    def launch(self, plan: StepPlan) -> InFlightStep:
        future = self._worker.submit(self.runner.launch, plan)
        return InFlightStep(plan.step_id, future, time.perf_counter())

    def collect(self, step: InFlightStep) -> StepResult:
        return self.call(self.runner.finish, step.future.result())

    def replay(self, slot: int, start: int, known_ids: list[int]):
        raise NotImplementedError("shadow checks run on the CPU backend only")

    def close(self) -> None:
        try:
            self.call(self.runner.close)
        finally:
            self._worker.shutdown(wait=True, cancel_futures=True)
