"""The GPU backend: the same launch / collect contract as CpuBackend, over CudaModelRunner.

Every CUDA call runs on one worker thread (numba binds its context per thread, and one thread
keeps the stream's order obvious). `launch` returns as soon as the step is enqueued on the
GPU; `collect` waits for the step's event, queued behind the next step's launch, so with
depth 2 the GPU is already running step N+1 while the host reads step N's tokens.
"""

import time
from concurrent.futures import ThreadPoolExecutor

from vtllm.executor.backend import InFlightStep
from vtllm.scheduler.plan import StepPlan, StepResult


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
