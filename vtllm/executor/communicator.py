"""The collectives a tensor-parallel forward needs, and their CPU form: N worker processes on
one host summing and gathering through one shared-memory file.

The Communicator protocol is what the sharded ops (executor/tp_ops) call; on GPUs the same
calls go to NCCL (executor/communicator_nccl). Both promise what the forward relies on: after
all_reduce every rank holds the same bits (here: the ranks' parts summed in rank order,
((p0 + p1) + p2) + ..., by every rank alike), and all_gather stacks the ranks' arrays in rank
order.

Everything a rank needs to join is a path (the shared file, one named pipe per rank), so the
ranks may be spawned processes or Ray actors placed on the engine's host alike.
"""

import os
import select
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Communicator(Protocol):
    rank: int
    world_size: int

    def all_reduce(self, x: np.ndarray) -> None:
        """x <- the sum over ranks of x, in place (float32, C-contiguous)."""

    def all_gather(self, x: np.ndarray, out: np.ndarray) -> None:
        """out [world_size, *x.shape] <- every rank's x, in rank order."""

    def barrier(self) -> None:
        """Returns once every rank has called it."""

    def close(self) -> None: ...


# Bytes each rank can put down at once; larger arrays go through in pieces. Big enough that a
# step's hidden state ([2048, 8192] float32 = 64 MiB) takes few pieces, small enough that N
# slots sit in a few hundred MiB of /dev/shm at most.
SLOT_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class ShmGroup:
    """What a rank needs to join: plain paths and numbers, picklable by multiprocessing and
    Ray alike."""

    path: str  # the shared file: world_size slots of slot_bytes
    world_size: int
    slot_bytes: int
    timeout: float | None  # a barrier wait longer than this fails the rank (a peer died)

    def pipe_path(self, rank: int) -> str:
        return f"{self.path}.{rank}"


def create_shm_group(world_size: int, *, timeout: float | None, slot_bytes=SLOT_BYTES):
    """The engine's side: the file and the ranks' pipes, before the workers start. The caller
    removes them (remove_shm_group) once every rank has opened them, or at close."""
    if world_size > 256:
        raise ValueError("a barrier token is one byte: 256 ranks at most")
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None
    fd, path = tempfile.mkstemp(prefix="vtllm-tp-", dir=where)
    try:
        os.ftruncate(fd, world_size * slot_bytes)
    finally:
        os.close(fd)
    group = ShmGroup(path, world_size, slot_bytes, timeout)
    for rank in range(world_size):
        os.mkfifo(group.pipe_path(rank), 0o600)
    return group


def remove_shm_group(group: ShmGroup) -> None:
    for path in (group.path, *(group.pipe_path(r) for r in range(group.world_size))):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class PipeBarrier:
    """A barrier over one named pipe per rank. At its k-th wait a rank writes its rank number
    (one byte) into every other rank's pipe, then reads its own until every other rank has
    arrived k times. Tokens are counted per sender, so a peer already at wait k + 1 is not
    mistaken for a late one at k. The kernel's pipe orders a rank's slot writes before its
    token against the reader's slot reads after it, on any CPU."""

    def __init__(self, group: ShmGroup, rank: int):
        self.timeout = group.timeout
        # O_RDWR: opening a FIFO this way never blocks on Linux, whoever else has it open yet
        self._own = os.open(group.pipe_path(rank), os.O_RDWR | os.O_NONBLOCK)
        self._peers = [
            os.open(group.pipe_path(r), os.O_RDWR) for r in range(group.world_size) if r != rank
        ]
        self._others = [r for r in range(group.world_size) if r != rank]
        self._arrived = [0] * group.world_size
        self._token = bytes([rank])
        self._waits = 0

    def wait(self) -> None:
        self._waits += 1
        for fd in self._peers:
            os.write(fd, self._token)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while any(self._arrived[r] < self._waits for r in self._others):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._own], [], [], left)[0]:
                raise TimeoutError(f"a tensor-parallel peer missed a barrier for {self.timeout}s")
            try:
                tokens = os.read(self._own, 4096)
            except BlockingIOError:
                continue
            for sender in tokens:
                self._arrived[sender] += 1

    def close(self) -> None:
        for fd in (self._own, *self._peers):
            os.close(fd)
        self._peers = []


class ShmCommunicator:
    """One rank of a ShmGroup. Each collective: every rank writes its part into its own slot,
    waits at the barrier, reads every slot, and waits again before the slots are reused."""

    def __init__(self, group: ShmGroup, rank: int):
        self.rank, self.world_size = rank, group.world_size
        self.group = group
        self._map = np.memmap(
            group.path, np.uint8, "r+", shape=(group.world_size, group.slot_bytes)
        )
        self._barrier = PipeBarrier(group, rank)
        self._lock = threading.Lock()  # collectives of one rank never interleave

    def barrier(self) -> None:
        self._barrier.wait()

    def all_reduce(self, x: np.ndarray) -> None:
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            raise ValueError("all_reduce takes a C-contiguous float32 array")
        flat = x.reshape(-1)
        slots = self._map.view(np.float32)  # [world, slot_bytes / 4]
        step = slots.shape[1]
        with self._lock:
            for a in range(0, flat.size, step):
                part = flat[a : a + step]
                n = part.size
                slots[self.rank, :n] = part
                self.barrier()
                np.copyto(part, slots[0, :n])
                for r in range(1, self.world_size):  # rank order: every rank the same bits
                    part += slots[r, :n]
                self.barrier()

    def all_gather(self, x: np.ndarray, out: np.ndarray) -> None:
        if out.shape != (self.world_size, *x.shape) or out.dtype != x.dtype:
            raise ValueError(f"all_gather of {x.shape} needs out {(self.world_size, *x.shape)}")
        if not out.flags.c_contiguous:
            raise ValueError("all_gather writes a C-contiguous out")
        src = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
        dst = out.reshape(self.world_size, -1).view(np.uint8)
        step = self.group.slot_bytes
        with self._lock:
            for a in range(0, src.size, step):
                n = min(step, src.size - a)
                self._map[self.rank, :n] = src[a : a + n]
                self.barrier()
                dst[:, a : a + n] = self._map[:, :n]
                self.barrier()

    def close(self) -> None:
        self._map = None
        self._barrier.close()
