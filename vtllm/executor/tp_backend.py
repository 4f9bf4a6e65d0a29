"""The tensor-parallel backend (--tensor-parallel-size N): the launch / collect contract of
CpuBackend and CudaBackend, over N worker processes (executor/tp_worker): on the cpu device
ranks that share a shared-memory communicator, on cuda one GPU a rank and NCCL (the engine
makes the unique id, so its process hosts NCCL's bootstrap root while the ranks join; under
numba's simulator the ranks stage their collectives through shared memory instead).

The scheduler stays single, in the engine: each StepPlan is encoded once and sent to every
rank in launch order (by one sender thread, so a launch never blocks the event loop on a full
pipe); rank 0 answers with the StepResult. Depth 2 holds as on one process: the ranks run
step N+1 while the engine reads step N's result.

A worker's death is seen at once by a collect that waits on it (it waits on rank 0's pipe and
on every process's sentinel together), and otherwise by the watchdog, which reads `failure`
(engine/watchdog.py): either way the engine dies, /health turns 503 and the server exits.
"""

import atexit
import logging
import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import wait

import msgspec

from vtllm.errors import InvalidParameter
from vtllm.executor.backend import InFlightStep
from vtllm.executor.communicator import ShmGroup, create_shm_group, remove_shm_group
from vtllm.executor.communicator_nccl import NcclCommunicator, NcclGroup, nccl_library_path
from vtllm.executor.tp_worker import BLOCKS, decode_result, worker_main
from vtllm.scheduler.plan import StepPlan, StepResult

log = logging.getLogger("vtllm.engine")

PLAN_ENCODER = msgspec.msgpack.Encoder()
START_TIMEOUT_S = 600.0  # loading, sharding, the kernels' first import (graphs) on every rank


class WorkerDied(RuntimeError):
    """A tensor-parallel worker process ended, or failed a step."""


class TpBackend:
    def __init__(
        self,
        config,
        loaded,
        world_size: int,
        *,
        num_blocks: int,
        max_model_len: int,
        threads: int,
        collective_timeout: float | None,
    ):
        ctx = multiprocessing.get_context("spawn")
        self.threads = threads
        self.world_size = world_size
        self.launch_seconds = 0.0  # a launch only queues the plan, as on CpuBackend
        self._device_seconds = 0.0
        self._closing = False
        self._group = make_group(config, world_size, collective_timeout)
        self._conns, self._procs = [], []
        per_rank = max(1, threads // world_size)
        try:
            for rank in range(world_size):
                ours, theirs = ctx.Pipe()
                # the workers load the file the engine loaded (LLM(loaded_model=...) included)
                model = (str(loaded.path), loaded.config)
                sizes = (num_blocks, max_model_len, per_rank)
                args = (rank, self._group, theirs, config, model, *sizes)
                proc = ctx.Process(target=worker_main, args=args, name=f"vtllm-tp{rank}")
                proc.daemon = True
                proc.start()
                theirs.close()
                self._conns.append(ours)
                self._procs.append(proc)
            blocks = []
            for rank in range(world_size):
                message = self._receive(rank, START_TIMEOUT_S)
                if message[:1] != b"K":
                    raise WorkerDied(f"tensor-parallel rank {rank} did not start")
                blocks.append(BLOCKS.unpack_from(message, 1)[0])
        except BaseException:
            self.close()
            raise
        finally:
            _remove_group(self._group)  # mapped by every rank (or never needed again)
        # every rank's cache holds this many blocks at least (GPUs size their own): one table
        self.num_blocks = min(blocks)
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vtllm-tp-send")
        # Before multiprocessing's own exit handler (registered earlier, so run later), which
        # would terminate() the workers (SIGTERM: ignored by them) and join them forever; the
        # server leaves its backend open at exit.
        atexit.register(self.close)
        if config.device == "cuda":
            log.info("tensor parallel: %d GPU worker processes, one GPU each", world_size)
        else:
            log.info("tensor parallel: %d CPU processes, %d threads each", world_size, per_rank)

    # -- the backend contract ---------------------------------------------------------------
    def launch(self, plan: StepPlan) -> InFlightStep:
        message = b"P" + PLAN_ENCODER.encode(plan)
        future = self._sender.submit(self._send_all, message)
        return InFlightStep(plan.step_id, future, time.perf_counter())

    def collect(self, step: InFlightStep) -> StepResult:
        step.future.result()
        message = self._receive(0, None)
        if message[:1] != b"R":
            raise WorkerDied(f"tensor-parallel rank 0 sent {message[:1]!r}")
        seconds, result = decode_result(message)
        self._device_seconds += seconds
        return result

    @property
    def device_seconds(self) -> float:
        return self._device_seconds

    def replay(self, slot: int, start: int, known_ids: list[int]):
        raise NotImplementedError("shadow checks run on a single CPU process only")

    @property
    def failure(self) -> str | None:
        """Why the backend cannot step any more (a worker ended), or None; the watchdog
        polls it."""
        if self._closing:
            return None
        for rank, proc in enumerate(self._procs):
            if not proc.is_alive():
                return f"tensor-parallel worker {rank} exited (code {proc.exitcode})"
        return None

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        atexit.unregister(self.close)
        sender = getattr(self, "_sender", None)
        if sender is not None:
            sender.shutdown(wait=True, cancel_futures=True)
        for conn in self._conns:
            try:
                conn.send_bytes(b"Q")
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=10.0)
            if proc.is_alive():  # stuck in a collective whose peer is gone
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        _remove_group(self._group)

    # -- pipes ------------------------------------------------------------------------------
    def _send_all(self, message: bytes) -> None:
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(message)
            except OSError as exc:
                raise WorkerDied(f"tensor-parallel worker {rank} is gone ({exc})") from None

    def _receive(self, rank: int, timeout: float | None) -> bytes:
        """The rank's next message; WorkerDied as soon as any worker process has ended, or a
        rank reports an error."""
        conn = self._conns[rank]
        sentinels = {p.sentinel: r for r, p in enumerate(self._procs)}
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait([conn, *sentinels], left)
            if not ready:
                raise WorkerDied(f"tensor-parallel rank {rank} sent nothing in {timeout:g}s")
            if conn in ready:
                try:
                    message = conn.recv_bytes()
                except (EOFError, OSError):
                    raise WorkerDied(f"tensor-parallel rank {rank} closed its pipe") from None
                if message[:1] == b"E":
                    raise WorkerDied(f"tensor-parallel rank {rank} failed:\n{message[1:].decode()}")
                return message
            for sentinel in ready:
                r = sentinels[sentinel]
                raise WorkerDied(
                    f"tensor-parallel worker {r} exited (code {self._procs[r].exitcode})"
                )


def simulating() -> bool:
    """numba's CUDA simulator is on (device arrays are host memory, no NCCL)."""
    from numba.core import config as numba_config

    return bool(numba_config.ENABLE_CUDASIM)


def make_group(config, world_size: int, timeout: float | None):
    """What the ranks join: an NCCL unique id on GPUs, else a shared-memory group (the CPU's
    communicator, and the simulator's ranks stage through it)."""
    if config.device == "cuda" and not simulating():
        return NcclGroup(NcclCommunicator.unique_id(), world_size)
    return create_shm_group(world_size, timeout=timeout)


def _remove_group(group) -> None:
    if isinstance(group, ShmGroup):
        remove_shm_group(group)


def check_gpu_ranks(world_size: int) -> None:
    """A one-line user error unless every rank of --tensor-parallel-size N gets its own GPU
    of those this process sees and NCCL is installed (the mp backend's ranks, on this host)."""
    if simulating():
        return
    from numba import cuda

    try:
        visible = len(cuda.gpus) if cuda.is_available() else 0
    except Exception:  # a broken driver counts as none
        visible = 0
    if world_size > visible:
        raise InvalidParameter(
            f"tensor_parallel_size {world_size} on cuda needs {world_size} GPUs, one a rank; "
            f"{visible} visible (CUDA_VISIBLE_DEVICES names those used)",
            param="tensor_parallel_size",
        )
    try:
        nccl_library_path()
    except InvalidParameter as exc:
        raise InvalidParameter(
            f"tensor_parallel_size {world_size}: {exc}", param="tensor_parallel_size"
        ) from None


def build_tp_backend(config, loaded, max_model_len: int, *, num_blocks: int | None, threads: int):
    """The backend of --tensor-parallel-size N > 1 (processes, or Ray actors: then N may be
    1); a user error (one line) where it cannot run: a model that does not split (config.resolve
    and build_parts refuse the other conflicts). num_blocks: the CPU's KV cache (every rank
    alike); None on cuda, where each rank sizes its own and the backend keeps the least."""
    from vtllm.models.sharding import check_weights

    n = config.tensor_parallel_size
    check_weights(loaded.config, loaded.weights, n)
    if config.distributed_executor_backend == "ray":
        from vtllm.executor.ray_backend import build_ray_backend

        return build_ray_backend(
            config, loaded, num_blocks=num_blocks, max_model_len=max_model_len, threads=threads
        )
    timeout = config.engine_iteration_timeout_s or 600.0
    return TpBackend(
        config,
        loaded,
        n,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        threads=threads,
        collective_timeout=timeout,
    )
