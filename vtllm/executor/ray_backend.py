"""--distributed-executor-backend ray: the tensor-parallel ranks as Ray actors, one per bundle of
a placement group, behind TpBackend's launch / collect contract (executor/tp_backend).

Each actor is tp_worker's rank (start_rank, execute) with Ray calls for a pipe. Ray runs an
actor's calls in the order one caller sent them, so the ranks see the plans in launch order and
depth 2 holds as with processes. Every rank returns from each step (rank 0 with the
StepResult), so a collect waits on the whole step and a rank that died or failed fails it at
once; the watchdog's beat (`failure`) sends each idle rank a ping and reads the last one back,
so an idle engine notices a dead actor too.

Communicator: on the CPU the shared-memory one, so every rank must sit on the engine's node
(checked by node id; refused in one line otherwise). On GPUs each actor holds one GPU (Ray
sets its CUDA_VISIBLE_DEVICES, so it binds device 0) and the ranks join an NCCL communicator
whose unique id rank 0's actor makes (the engine's node may have no GPU or NCCL) and the
engine hands to every rank.
"""

import logging
import os
import time

from vtllm.errors import InvalidParameter
from vtllm.executor import ray_cluster
from vtllm.executor.backend import InFlightStep
from vtllm.executor.communicator import ShmGroup, create_shm_group, remove_shm_group
from vtllm.executor.communicator_nccl import NcclGroup
from vtllm.executor.tp_backend import PLAN_ENCODER, WorkerDied, simulating
from vtllm.executor.tp_worker import decode_result
from vtllm.scheduler.plan import StepPlan, StepResult

log = logging.getLogger("vtllm.engine")


class RayRank:
    """One rank; made a Ray actor class by ray.remote at start (this module never imports ray
    at its top, so the mp backend never needs it)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.runner = None

    def where(self) -> tuple[str, int]:
        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()

    def start(self, group, config, model, num_blocks, max_model_len, threads) -> int:
        """The rank's KV block count once it is ready."""
        from vtllm.executor.tp_worker import start_rank

        self.runner = start_rank(
            self.rank, group, config, model, num_blocks, max_model_len, threads, gpu=0
        )
        return self.runner.num_blocks

    def step(self, message: bytes) -> bytes | None:
        from vtllm.executor.tp_worker import execute

        return execute(self.runner, self.rank, message)

    def ping(self) -> bool:
        return True

    def nccl_unique_id(self) -> bytes:
        """Made on rank 0's node (the engine's may have no GPU), handed to every rank."""
        from vtllm.executor.communicator_nccl import NcclCommunicator

        return NcclCommunicator.unique_id()


class RayTpBackend:
    def __init__(self, config, loaded, world_size, *, num_blocks, max_model_len, threads, timeout):
        self.ray, self._owns_ray = ray_cluster.connect()
        ray = self.ray
        self.threads, self.world_size = threads, world_size
        self.launch_seconds = 0.0
        self._device_seconds = 0.0
        self._closing = False
        self._actors, self._group, self._placement = [], None, None
        nccl = config.device == "cuda" and not simulating()
        gpus = {"GPU": 1} if nccl else {}
        try:
            per_rank = max(1, threads // world_size)
            bundles = [{"CPU": 1, **gpus}] * world_size
            self._placement = ray_cluster.place(ray, bundles, f"{world_size} tensor ranks")
            actor_class = ray.remote(RayRank)
            for rank in range(world_size):
                options = ray_cluster.in_bundle(self._placement, rank)
                actor = actor_class.options(
                    num_cpus=1, num_gpus=len(gpus), max_restarts=0, **options
                )
                self._actors.append(actor.remote(rank))
            places = ray.get([a.where.remote() for a in self._actors])
            self.pids = [pid for _node, pid in places]
            if nccl:  # NCCL crosses nodes; the id is made where rank 0 runs
                unique_id = ray.get(self._actors[0].nccl_unique_id.remote())
                self._group = NcclGroup(unique_id, world_size)
            else:
                self._check_one_node(places)
                self._group = create_shm_group(world_size, timeout=timeout)
            model = (str(loaded.path), loaded.config)  # the file the engine loaded
            sizes = (num_blocks, max_model_len, per_rank)
            starts = [a.start.remote(self._group, config, model, *sizes) for a in self._actors]
            # every rank's cache holds this many blocks at least (GPUs size their own)
            self.num_blocks = min(self._wait_all(starts))
        except BaseException:
            self.close()
            raise
        finally:
            if isinstance(self._group, ShmGroup):
                remove_shm_group(self._group)  # opened by every rank (or never needed again)
        self._pings = [a.ping.remote() for a in self._actors]
        log.info("tensor parallel: %d Ray actors, %d threads each", world_size, per_rank)

    def _check_one_node(self, places: list[tuple[str, int]]) -> None:
        here = ray_cluster.node_id(self.ray)
        away = [rank for rank, (node, _pid) in enumerate(places) if node != here]
        if away:
            raise InvalidParameter(
                f"tensor ranks {away} were placed on another node than the engine's: the CPU "
                "path's shared-memory communicator needs every rank on the engine's node "
                "(start vtllm on the node that has the CPUs, or give it fewer ranks)",
                param="distributed_executor_backend",
            )

    # -- the backend contract ---------------------------------------------------------------
    def launch(self, plan: StepPlan) -> InFlightStep:
        message = b"P" + PLAN_ENCODER.encode(plan)
        refs = [actor.step.remote(message) for actor in self._actors]
        return InFlightStep(plan.step_id, refs, time.perf_counter())

    def collect(self, step: InFlightStep) -> StepResult:
        replies = self._wait_all(step.future)
        seconds, result = decode_result(replies[0])
        self._device_seconds += seconds
        return result

    @property
    def device_seconds(self) -> float:
        return self._device_seconds

    def replay(self, slot: int, start: int, known_ids: list[int]):
        raise NotImplementedError("shadow checks run on a single CPU process only")

    @property
    def failure(self) -> str | None:
        """Why the backend cannot step any more (an actor died), or None; the watchdog polls
        it. A rank busy with steps leaves its ping unanswered: its collect sees a death."""
        if self._closing:
            return None
        done, _ = self.ray.wait(self._pings, num_returns=len(self._pings), timeout=0)
        for rank, ping in enumerate(self._pings):
            if ping in done:
                try:
                    self.ray.get(ping)
                except Exception as exc:
                    return f"tensor-parallel actor {rank} died ({type(exc).__name__})"
                self._pings[rank] = self._actors[rank].ping.remote()
        return None

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        for actor in self._actors:  # a rank stuck in a collective ends too
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception as exc:
                log.debug("actor already gone: %s", exc)
        if self._placement is not None:
            ray_cluster.remove(self.ray, self._placement)
        if isinstance(self._group, ShmGroup):
            remove_shm_group(self._group)
        if self._owns_ray:
            self.ray.shutdown()

    def _wait_all(self, refs: list) -> list:
        """Every ref's value; WorkerDied as soon as any of them failed (an actor died, or a
        rank raised), without waiting for the others."""
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    self.ray.get(ref)
                except Exception as exc:
                    rank = refs.index(ref)
                    raise WorkerDied(f"tensor-parallel actor {rank} failed: {exc}") from None
        return self.ray.get(refs)


def build_ray_backend(config, loaded, *, num_blocks, max_model_len, threads):
    """The ray backend's ranks (tensor_parallel_size of them, one included)."""
    timeout = config.engine_iteration_timeout_s or 600.0
    return RayTpBackend(
        config,
        loaded,
        config.tensor_parallel_size,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        threads=threads,
        timeout=timeout,
    )
