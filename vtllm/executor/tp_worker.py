"""One tensor-parallel rank: a process that loads the model, keeps its shard, and runs every
StepPlan the engine sends through a runner over the sharded ops: on the cpu device a
ModelRunner over ShardedCpuOps (executor/tp_ops), on cuda a CudaModelRunner over ShardedCudaOps
(executor/cuda_tp_ops) on the rank's own GPU. Every rank samples (the same logits, the same
seeds: the same tokens), so each keeps its own token mirror; only rank 0 sends the StepResult
back.

start_rank and execute are the rank, whatever carries its messages: a spawned process fed
over a pipe (worker_main, executor/tp_backend) or a Ray actor (executor/ray_backend).

Wire (one pipe per rank, engine -> worker): b"P" + msgpack StepPlan runs a step, b"Q" ends the
worker. Worker -> engine: b"R" + 8-byte step seconds + msgpack StepResult (rank 0 only), b"E"
+ text when a step failed, b"K" + the rank's KV block count (8 bytes) once ready. A GPU rank
launches a plan that is already queued before it reads the tokens of the one before (depth 2,
as CudaBackend: the GPU runs step N + 1 while the host reads step N's tokens). SIGINT
and SIGTERM are ignored: the engine drains and then ends its workers; a worker also ends when
the engine's end of its pipe closes.
"""

import logging
import signal
import struct
import sys
import time
import traceback
from collections import deque

import msgspec
import numpy as np

from vtllm.scheduler.plan import StepPlan, StepResult

log = logging.getLogger("vtllm.engine")

PLAN_DECODER = msgspec.msgpack.Decoder(StepPlan)
RESULT_ENCODER = msgspec.msgpack.Encoder()
SECONDS = struct.Struct("<d")
BLOCKS = struct.Struct("<q")


def make_runner(model_config, shard, comm, kernels, kv, *, max_num_seqs: int, max_model_len: int):
    """A ModelRunner whose model runs the rank's shard over ShardedCpuOps; the sampler, the
    mirror and the slot state are the full model's (full logits reach every rank)."""
    from vtllm.executor.runner import ModelRunner, StepRunner
    from vtllm.executor.tp_ops import ShardedCpuOps
    from vtllm.models.registry import model_class

    class ShardRunner(ModelRunner):
        def __init__(self):
            StepRunner.__init__(
                self,
                model_config,
                block_size=kv.block_size,
                max_num_seqs=max_num_seqs,
                max_model_len=max_model_len,
            )
            self.ops, self.kv = kernels, kv
            model_ops = ShardedCpuOps(kernels, shard, comm, model_config.vocab_size)
            forward = model_class(model_config.architecture)
            self.model = forward(shard.config, shard.weights, model_ops, max_model_len + 1)
            model_ops.bind_kv(kv)
            self.token_ids = np.zeros((max_num_seqs, max_model_len + 1), np.int32)
            self.num_tokens = np.zeros(max_num_seqs, np.int32)

    return ShardRunner()


def worker_main(rank, group, conn, config, model, num_blocks, max_model_len, threads) -> None:
    """The process's entry (multiprocessing spawn); model: (path, the engine's ModelConfig).
    On cuda, rank r binds GPU r of those the process sees."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        runner = start_rank(rank, group, config, model, num_blocks, max_model_len, threads)
    except Exception:
        conn.send_bytes(b"E" + traceback.format_exc().encode())
        raise
    conn.send_bytes(b"K" + BLOCKS.pack(runner.num_blocks))
    # a GPU's launch only enqueues: the next plan, if queued, is launched before a step's
    # tokens are read; a CPU's launch computes the step, whose result goes back at once
    depth = 2 if config.device == "cuda" else 1
    pending = deque()  # (started, the runner's step in flight), in launch order
    while True:
        try:
            if pending and (len(pending) >= depth or not conn.poll()):
                reply = _finish(runner, rank, *pending.popleft())
                if reply is not None:
                    conn.send_bytes(reply)
                continue
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):  # the engine is gone
                return
            if message[:1] == b"Q":
                return
            started = time.perf_counter()
            pending.append((started, runner.launch(PLAN_DECODER.decode(message[1:]))))
        except Exception:
            conn.send_bytes(b"E" + traceback.format_exc().encode())
            raise


def execute(runner, rank: int, message: bytes) -> bytes | None:
    """Runs one b"P" message's plan; rank 0's reply (b"R" + seconds + StepResult), else None."""
    started = time.perf_counter()
    return _finish(runner, rank, started, runner.launch(PLAN_DECODER.decode(message[1:])))


def _finish(runner, rank: int, started: float, pending) -> bytes | None:
    before = getattr(runner, "device_seconds", None)  # a GPU times its steps with events
    result = runner.finish(pending)
    if rank != 0:
        return None
    seconds = time.perf_counter() - started if before is None else runner.device_seconds - before
    return b"R" + SECONDS.pack(seconds) + RESULT_ENCODER.encode(result)


def start_rank(rank, group, config, model, num_blocks, max_model_len, threads, gpu=None):
    """Loads the model, keeps the rank's shard and joins the group; the rank's runner. On cuda:
    num_blocks is the rank's own (from its GPU's memory: runner.num_blocks), and gpu the index
    of the device it binds (default: its rank; a Ray actor sees only its own GPU, 0)."""
    import numba

    if config.device == "cuda":
        return _start_cuda_rank(rank, group, config, model, max_model_len, gpu)

    from vtllm.executor.backend import cpu_ops
    from vtllm.executor.communicator import ShmCommunicator
    from vtllm.executor.host_memory import release_start_pages
    from vtllm.executor.kv_cache import allocate_kv_cache
    from vtllm.models.loader import load_model
    from vtllm.models.sharding import shard_weights

    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    comm = ShmCommunicator(group, rank)
    path, engine_config = model
    loaded = load_model(path)
    if loaded.config != engine_config:
        raise RuntimeError(f"{path} did not load as the engine loaded it")
    shard = shard_weights(loaded.config, loaded.weights, rank, group.world_size)
    kernels = cpu_ops(config.cpu_numerics)
    kv = allocate_kv_cache(shard.config, num_blocks, config.block_size)
    model_config = loaded.config
    del loaded  # the full weights go: the shard's arrays are copies
    runner = make_runner(
        model_config,
        shard,
        comm,
        kernels,
        kv,
        max_num_seqs=config.max_num_seqs,
        max_model_len=max_model_len,
    )
    comm.barrier()  # every rank has mapped the shared file: the engine may remove its name
    release_start_pages(f"rank {rank} ready")  # as the engine's own start does
    runner.num_blocks = num_blocks
    return runner


def _start_cuda_rank(rank, group, config, model, max_model_len, gpu):
    """A CudaModelRunner over the rank's shard on its GPU, graphs captured as on one GPU."""
    from numba import cuda
    from numba.core import config as numba_config

    from vtllm.executor.cuda_backend import capture_graphs, runner_settings
    from vtllm.executor.cuda_runner import CudaModelRunner
    from vtllm.executor.device_communicator import join_device_group, warm_up
    from vtllm.models.loader import load_model
    from vtllm.models.sharding import shard_weights

    if not numba_config.ENABLE_CUDASIM:  # first of all: every later call uses its context
        cuda.select_device(rank if gpu is None else gpu)
    else:  # each simulated CUDA thread is a Python thread, polled at barriers: switch often
        sys.setswitchinterval(1e-4)
    path, engine_config = model
    loaded = load_model(path)
    if loaded.config != engine_config:
        raise RuntimeError(f"{path} did not load as the engine loaded it")
    shard = shard_weights(loaded.config, loaded.weights, rank, group.world_size)
    comm = join_device_group(group, rank)
    largest = max(config.max_num_batched_tokens, config.max_num_seqs) * loaded.config.hidden_size
    warm_up(comm, largest, cuda.stream())  # before the KV cache takes its share of the memory
    settings = runner_settings(config, max_model_len)
    runner = CudaModelRunner(loaded, **settings, shard=shard, comm=comm)
    del loaded  # the full weights go: the shard's arrays are copies, uploaded now
    if config.cuda_graphs:  # rank 0's progress bar stands for every rank's
        capture_graphs(runner, f"CUDA graphs (rank {rank})", progress=rank == 0)
    comm.barrier()  # every rank has joined: the engine may drop the group's shared file
    return runner


def decode_result(message: bytes) -> tuple[float, StepResult]:
    return SECONDS.unpack_from(message, 1)[0], _RESULT_DECODER.decode(message[1 + SECONDS.size :])


_RESULT_DECODER = msgspec.msgpack.Decoder(StepResult)
