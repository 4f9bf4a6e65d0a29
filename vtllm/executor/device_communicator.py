"""The collectives of a tensor-parallel rank on the CUDA backend, on device arrays, enqueued on
the stream the caller names (the step's: executor/cuda_tp_ops calls them there).

Two implementations of the DeviceCommunicator protocol:
- NcclCommunicator (executor/communicator_nccl): NCCL kernels on the stream, never a host
  wait, so a CUDA graph captures them with the step's kernels. One GPU a rank.
- HostStagedCommunicator: the stream's arrays copied to the host, the CPU communicator
  (executor/communicator: the ranks' parts summed in rank order), copied back. It waits for
  the stream, so it cannot run inside a captured graph: it is the one numba's simulator runs
  (device arrays are host memory there), so that the sharded CUDA forward is tested without a
  GPU.

Both give every rank the same bits after each call, which the ranks' samplers rely on.
"""

from typing import Protocol

import numpy as np

from vtllm.executor.communicator import ShmCommunicator, ShmGroup
from vtllm.executor.communicator_nccl import NcclCommunicator, NcclGroup


class DeviceCommunicator(Protocol):
    rank: int
    world_size: int

    def all_reduce(self, x, *, stream) -> None:
        """x <- the sum over ranks of x, in place (a C-contiguous float32 device array)."""

    def all_gather(self, x, out, *, stream) -> None:
        """out [world_size, *x.shape] <- every rank's x, in rank order (device arrays)."""

    def barrier(self) -> None:
        """Returns once every rank has called it."""

    def close(self) -> None: ...


class HostStagedCommunicator:
    """A DeviceCommunicator over a host Communicator (the module docstring)."""

    def __init__(self, host):
        self.host = host
        self.rank, self.world_size = host.rank, host.world_size

    def all_reduce(self, x, *, stream) -> None:
        if x.size == 0:
            return
        staged = x.copy_to_host(stream=stream)
        stream.synchronize()
        self.host.all_reduce(staged)
        x.copy_to_device(staged, stream=stream)
        stream.synchronize()  # staged is pageable memory: the copy must end before it goes

    def all_gather(self, x, out, *, stream) -> None:
        staged = x.copy_to_host(stream=stream)
        stream.synchronize()
        gathered = np.empty((self.world_size, *staged.shape), staged.dtype)
        self.host.all_gather(staged, gathered)
        out.copy_to_device(gathered, stream=stream)
        stream.synchronize()

    def barrier(self) -> None:
        self.host.barrier()

    def close(self) -> None:
        self.host.close()


def join_device_group(group, rank: int) -> DeviceCommunicator:
    """Rank `rank`'s communicator: NCCL for an NcclGroup (the current device must be the
    rank's GPU), host-staged over shared memory for a ShmGroup (the simulator's ranks)."""
    if isinstance(group, NcclGroup):
        return NcclCommunicator(group.unique_id, rank, group.world_size)
    if isinstance(group, ShmGroup):
        return HostStagedCommunicator(ShmCommunicator(group, rank))
    raise TypeError(f"no device communicator joins a {type(group).__name__}")


def warm_up(comm: DeviceCommunicator, elements: int, stream) -> None:
    """A small and a large all-reduce and all-gather (elements float32 at most), before the KV
    cache takes its share of the device memory: NCCL connects its peers, and allocates their
    buffers, at a collective's first use of an algorithm rather than at init."""
    from numba import cuda

    world = comm.world_size
    for n in sorted({min(256, elements), elements}):
        x = cuda.device_array(n, np.float32, stream=stream)  # any bits: nothing reads the sums
        part = max(1, n // world)
        out = cuda.device_array((world, part), np.float32, stream=stream)
        comm.all_reduce(x, stream=stream)
        comm.all_gather(x[:part], out, stream=stream)
    stream.synchronize()
    comm.barrier()
    del x, out
    pending = getattr(cuda.current_context(), "deallocations", None)
    if pending is not None:  # numba frees device memory in batches: these go now
        pending.clear()
