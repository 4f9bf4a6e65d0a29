"""Backends run steps off the event loop: launch(plan) -> InFlightStep, collect(step) -> result.

The CPU backend's "device" is one worker thread: steps run in launch order, so step N+1's
input gather sees the tokens step N's sampler wrote into the mirror. numba kernels release
the GIL (nogil=True), so the event loop keeps running while a step computes.

Both backends count where a step's time goes (read by /metrics): `device_seconds`, the
device running steps, and `launch_seconds`, the backend's thread enqueuing them (zero on the
CPU, whose launch only queues the plan; its whole step is the device's). The CPU backend
counts a running step's seconds up to the moment it is read, so the counter's difference
over any window never exceeds the window (a step that straddles a scrape is split at it).
"""

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from vtllm.executor.runner import ModelRunner
from vtllm.executor.shadow import replay_chunk
from vtllm.scheduler.plan import StepPlan, StepResult


def cpu_ops(numerics: str):
    """The CPU kernel table the runner calls as `ops`: "fast" runs int8 activations in quantized
    matmuls, anything else the exact float32 kernels. Imported on call: kernels.cpu compiles its
    njit kernels on import."""
    if numerics == "fast":
        from vtllm.kernels.cpu import fast as ops
    else:
        from vtllm.kernels import cpu as ops
    return ops


@dataclass(slots=True)
class InFlightStep:
    step_id: int
    future: Future
    launched_at: float


class CpuBackend:
    def __init__(self, runner: ModelRunner, *, threads: int):
        import numba

        self.runner = runner
        self.threads = threads
        self.launch_seconds = 0.0
        self._mask_events: dict[int, threading.Event] = {}  # step id -> its masks are in
        self._device_seconds = 0.0  # finished steps
        self._step_started: float | None = None  # the running step's perf_counter start
        self._clock = threading.Lock()  # the worker's updates against a scrape's read
        # numba's thread count is per calling thread, so the worker sets its own.
        self._worker = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="vtllm-step",
            initializer=numba.set_num_threads,
            initargs=(threads,),
        )

    def launch(self, plan: StepPlan) -> InFlightStep:
        future = self._worker.submit(self._execute, plan)
        return InFlightStep(plan.step_id, future, time.perf_counter())

    def defer_masks(self, plan: StepPlan) -> None:
        """The next launch of `plan` runs its forward at once and samples once send_masks()
        has filled plan.token_masks: the host computes them while the forward runs."""
        self._mask_events[plan.step_id] = threading.Event()

    def send_masks(self, plan: StepPlan) -> None:
        self._mask_events.pop(plan.step_id).set()

    def _execute(self, plan: StepPlan) -> StepResult:
        with self._clock:
            self._step_started = time.perf_counter()
        ready = self._mask_events.get(plan.step_id)
        try:
            if ready is None:
                return self.runner.execute(plan)
            return self.runner.execute(plan, ready.wait)
        finally:
            with self._clock:
                self._device_seconds += time.perf_counter() - self._step_started
                self._step_started = None

    @property
    def device_seconds(self) -> float:
        """Seconds the worker spent running steps, the running one's so far included."""
        with self._clock:
            running = 0.0
            if self._step_started is not None:
                running = time.perf_counter() - self._step_started
            return self._device_seconds + running

    def collect(self, step: InFlightStep) -> StepResult:
        return step.future.result()

    def replay(self, slot: int, start: int, known_ids: list[int]) -> Future:
        """Queue a shadow replay behind the steps in flight (see executor.shadow)."""
        return self._worker.submit(replay_chunk, self.runner, slot, start, known_ids)

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)
