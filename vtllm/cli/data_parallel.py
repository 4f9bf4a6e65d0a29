"""`vtllm serve --data-parallel-size N`: N replica servers, then the router in front of them
(server/data_parallel.py).

A replica is a whole `vtllm serve` with data_parallel_size 1 on a port of its own: a spawned
process of this host (mp), or a process that a Ray actor spawns on the node its bundle was
placed on (ray; replicas then listen on every interface of their node, and the actor's bundle
gives the replica its CPUs or its GPU: Ray sets CUDA_VISIBLE_DEVICES per actor). Each replica
gets 1/N of the KV budget and of the CPU threads, since they share a host's memory and cores
under mp. Every replica process ends with its parent (PR_SET_PDEATHSIG), so a router killed
outright leaves none behind.

Why a router over whole servers rather than N engines inside one server: each replica keeps
its own event loop, scheduler and watchdog (the host work vLLM moves into per-replica engine
processes), the server's code stays one engine's, and replicas on other nodes need nothing
but their address.
"""

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time

import anyio
import msgspec

from vtllm.errors import InvalidParameter

log = logging.getLogger("vtllm.server")

START_TIMEOUT_S = 900.0  # load, compile and warm-up of every replica
STOP_TIMEOUT_S = 60.0  # beyond the replica's own drain deadline


def run_data_parallel(config) -> int:
    from vtllm.server.data_parallel import RouterState, fetch, serve_router

    n = config.data_parallel_size
    if config.device == "cuda" and config.distributed_executor_backend == "mp":
        raise InvalidParameter(
            f"data_parallel_size {n} on the cuda device: use --distributed-executor-backend ray, "
            "which gives each replica its own GPU",
            param="data_parallel_size",
        )
    if config.distributed_executor_backend == "ray":
        replicas = RayReplicas(config).replicas
    else:
        replicas = [ProcessReplica(replica_config(config, "127.0.0.1"), i) for i in range(n)]
    try:
        _wait_ready(replicas, fetch)
    except BaseException:
        for replica in replicas:
            replica.stop(wait=True)
        raise
    anyio.run(serve_router, RouterState(replicas, config))
    return 0


def replica_config(config, host: str):
    """One replica's settings: a free port, 1/N of the KV cache and of the CPU threads."""
    n = config.data_parallel_size
    threads = config.cpu_threads or max(1, len(os.sched_getaffinity(0)) // n)
    return msgspec.structs.replace(
        config,
        host=host,
        port=_free_port(host),
        data_parallel_size=1,
        distributed_executor_backend="mp",  # a replica's tensor ranks: on its node
        kv_cache_memory=config.kv_cache_memory // n,
        kv_cache_fraction=config.kv_cache_fraction / n,
        cpu_threads=threads,
    )


def replica_main(config, index: int) -> None:
    """A replica process: `vtllm serve` on its config, ending with its parent."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the parent's end is our SIGTERM
    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s [replica {index}]: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("numba").setLevel(logging.WARNING)
    from vtllm.cli.serve import serve_config

    sys.exit(serve_config(config))


class ProcessReplica:
    def __init__(self, config, index: int):
        self.host, self.port = config.host, config.port
        ctx = multiprocessing.get_context("spawn")
        self.proc = ctx.Process(target=replica_main, args=(config, index), name=f"vtllm-dp{index}")
        self.proc.start()

    def failure(self) -> str | None:
        code = self.proc.exitcode
        return None if code is None else f"its process exited with code {code}"

    def stop(self, *, wait: bool) -> None:
        if self.proc.exitcode is None:
            self.proc.terminate()  # SIGTERM: the replica drains
        if wait:
            self.proc.join(STOP_TIMEOUT_S)
            if self.proc.exitcode is None:
                self.proc.kill()
                self.proc.join()


class RayReplicas:
    """The replicas as Ray actors, one bundle each."""

    def __init__(self, config):
        from vtllm.executor import ray_cluster

        self.ray, _ = ray_cluster.connect("data_parallel_size")
        n, tp = config.data_parallel_size, config.tensor_parallel_size
        per_replica = {"GPU": tp, "CPU": 1} if config.device == "cuda" else {"CPU": tp}
        group = ray_cluster.place(self.ray, [per_replica] * n, f"{n} data-parallel replicas")
        actor_class = self.ray.remote(ReplicaActor)
        self.replicas = []
        for i in range(n):
            options = {**ray_cluster.in_bundle(group, i), "max_restarts": 0}
            options.update(num_cpus=per_replica["CPU"], num_gpus=per_replica.get("GPU", 0))
            actor = actor_class.options(**options).remote(config, i)
            self.replicas.append(RayReplica(self.ray, actor, *self.ray.get(actor.address.remote())))


class ReplicaActor:
    """Runs inside a Ray worker: spawns the replica process on its node."""

    def __init__(self, config, index: int):
        import ray

        self.host = ray.util.get_node_ip_address()
        config = replica_config(config, "0.0.0.0")
        self.port = config.port
        self.replica = ProcessReplica(config, index)

    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def failure(self) -> str | None:
        return self.replica.failure()

    def stop(self) -> None:
        self.replica.stop(wait=True)


class RayReplica:
    def __init__(self, ray, actor, host: str, port: int):
        self.ray, self.actor, self.host, self.port = ray, actor, host, port
        self._check = None
        self._stopped = None

    def failure(self) -> str | None:
        """The replica process's end, or its actor's (the node gone), read from the last
        check; a new check is sent when that one has answered."""
        if self._check is None:
            self._check = self.actor.failure.remote()
        done, _ = self.ray.wait([self._check], timeout=0)
        if not done:
            return None
        check, self._check = self._check, None
        try:
            return self.ray.get(check)
        except Exception as exc:
            return f"its actor died ({type(exc).__name__})"

    def stop(self, *, wait: bool) -> None:
        if self._stopped is None:
            self._stopped = self.actor.stop.remote()
        if wait:
            try:
                self.ray.get(self._stopped, timeout=STOP_TIMEOUT_S)
            except Exception as exc:
                log.debug("replica actor stop: %s", exc)
            self.ray.kill(self.actor)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _wait_ready(replicas, fetch) -> None:
    """Until every replica's /health answers 200 (each binds its socket only once it has
    warmed up); a replica that ends meanwhile fails the start."""
    deadline = time.monotonic() + START_TIMEOUT_S
    waiting = set(range(len(replicas)))
    while waiting:
        for i in sorted(waiting):
            reason = replicas[i].failure()
            if reason is not None:
                raise RuntimeError(f"data-parallel replica {i} did not start: {reason}")
            try:
                status, _ = anyio.run(fetch, replicas[i].host, replicas[i].port, "/health")
            except OSError:
                continue
            if status == 200:
                waiting.discard(i)
        if time.monotonic() > deadline:
            raise RuntimeError(f"data-parallel replicas {sorted(waiting)} did not start")
        time.sleep(0.5)
    log.info("data-parallel replicas ready: %s", [f"{r.host}:{r.port}" for r in replicas])
