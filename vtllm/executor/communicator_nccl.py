"""The GPU communicator: NCCL through ctypes, from the `nvidia-nccl-cu13` wheel (the `cuda`
extra; as vLLM's pynccl binds it), so the CUDA backend's sharded ops (executor/cuda_tp_ops)
enqueue their collectives on the step's stream, where a CUDA graph captures them like any
kernel (executor/device_communicator has the protocol).

Wire-up, per engine: the engine calls `unique_id()` once (its process then hosts NCCL's
bootstrap root until every rank has joined) and hands the 128 bytes to every rank in an
NcclGroup; each rank binds its GPU, then `NcclCommunicator(unique_id, rank, world)`. Arrays are
numba.cuda device arrays (anything with __cuda_array_interface__). NCCL's ring or tree
all-reduce gives every rank the same bits, though not the CPU communicator's rank-order sum.
At world size 1, NCCL enqueues nothing for an in-place all-reduce and a device copy for an
all-gather.
"""

import ctypes
import glob
import os
from dataclasses import dataclass

import numpy as np

from vtllm.errors import InvalidParameter

NCCL_SUM = 0
NCCL_TYPES = {  # ncclDataType_t
    np.dtype(np.int8): 0,
    np.dtype(np.uint8): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3,
    np.dtype(np.int64): 4,
    np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.float64): 8,
}
NCCL_BFLOAT16 = 9  # ml_dtypes.bfloat16 arrays, or uint16 bits marked as bf16 by the caller


@dataclass(frozen=True, slots=True)
class NcclGroup:
    """What a rank needs to join (picklable, as executor/communicator's ShmGroup)."""

    unique_id: bytes  # NcclCommunicator.unique_id(), made once by the engine
    world_size: int


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def nccl_library_path() -> str:
    """libnccl.so.2 of the nvidia-nccl-cu13 wheel; a one-line user error without it."""
    try:
        import nvidia.nccl as wheel  # the nvidia-nccl-cu13 wheel's namespace package
    except ImportError:
        raise InvalidParameter(
            "tensor parallelism on GPUs needs NCCL: pip install nvidia-nccl-cu13",
            param="tensor_parallel_size",
        ) from None
    for root in wheel.__path__:
        found = sorted(glob.glob(os.path.join(root, "lib", "libnccl.so*")))
        if found:
            return found[0]
    raise InvalidParameter(
        "the nvidia-nccl-cu13 wheel holds no lib/libnccl.so", param="tensor_parallel_size"
    )


class _Nccl:
    """The few NCCL entry points, typed."""

    def __init__(self, path: str):
        lib = self.lib = ctypes.CDLL(path)
        p, i, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetErrorString.argtypes = [i]
        lib.ncclGetVersion.argtypes = [ctypes.POINTER(i)]
        lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(NcclUniqueId)]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(p), i, NcclUniqueId, i]
        lib.ncclAllReduce.argtypes = [p, p, size, i, i, p, p]
        lib.ncclAllGather.argtypes = [p, p, size, i, p, p]
        lib.ncclCommDestroy.argtypes = [p]
        for name in (
            "ncclGetVersion",
            "ncclGetUniqueId",
            "ncclCommInitRank",
            "ncclAllReduce",
            "ncclAllGather",
            "ncclCommDestroy",
        ):
            getattr(lib, name).restype = i

    def check(self, result: int, what: str) -> None:
        if result != 0:
            message = self.lib.ncclGetErrorString(result).decode()
            raise RuntimeError(f"{what}: NCCL error {result} ({message})")

    def version(self) -> int:
        v = ctypes.c_int()
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        return v.value


def _pointer(array) -> int:
    return int(array.__cuda_array_interface__["data"][0])


def _stream_handle(stream) -> int:
    """A numba.cuda stream's CUstream as an integer (0: the default stream)."""
    if stream is None:
        return 0
    handle = getattr(stream, "handle", stream)
    handle = getattr(handle, "value", handle)
    return int(handle or 0)


def _nccl_type(array) -> int:
    dtype = np.dtype(array.dtype)
    if dtype.name == "bfloat16":
        return NCCL_BFLOAT16
    if dtype not in NCCL_TYPES:
        raise ValueError(f"NCCL has no type for {dtype}")
    return NCCL_TYPES[dtype]


class NcclCommunicator:
    """executor/device_communicator's DeviceCommunicator over one NCCL communicator: every call
    is enqueued on the stream it is given and returns at once (graph-capturable)."""

    def __init__(self, unique_id: bytes, rank: int, world_size: int, *, path=None):
        self.nccl = _Nccl(path or nccl_library_path())
        self.rank, self.world_size = rank, world_size
        uid = NcclUniqueId()
        ctypes.memmove(uid.internal, unique_id, 128)
        comm = ctypes.c_void_p()
        self.nccl.check(
            self.nccl.lib.ncclCommInitRank(ctypes.byref(comm), world_size, uid, rank),
            "ncclCommInitRank",
        )
        self.comm = comm
        self._token = self._stream = None  # barrier()'s one-float buffer and its own stream

    @staticmethod
    def unique_id(path=None) -> bytes:
        """The id every rank joins with; made once, by the engine."""
        nccl = _Nccl(path or nccl_library_path())
        uid = NcclUniqueId()
        nccl.check(nccl.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return bytes(uid.internal)

    def all_reduce(self, x, *, stream) -> None:
        if x.size == 0:
            return
        ptr = _pointer(x)
        self.nccl.check(
            self.nccl.lib.ncclAllReduce(
                ptr, ptr, x.size, _nccl_type(x), NCCL_SUM, self.comm, _stream_handle(stream)
            ),
            "ncclAllReduce",
        )

    def all_gather(self, x, out, *, stream) -> None:
        if tuple(out.shape) != (self.world_size, *x.shape):
            raise ValueError(f"all_gather of {x.shape} needs out {(self.world_size, *x.shape)}")
        if x.size == 0:
            return
        self.nccl.check(
            self.nccl.lib.ncclAllGather(
                _pointer(x),
                _pointer(out),
                x.size,
                _nccl_type(x),
                self.comm,
                _stream_handle(stream),
            ),
            "ncclAllGather",
        )

    def barrier(self) -> None:
        """NCCL has no barrier: a one-float all-reduce on a stream of its own, waited for on
        the host (never while a graph is being captured)."""
        from numba import cuda

        if self._token is None:
            self._stream = cuda.stream()
            self._token = cuda.device_array(1, np.float32, stream=self._stream)
        self.all_reduce(self._token, stream=self._stream)
        self._stream.synchronize()

    def close(self) -> None:
        if self.comm is not None:
            self.nccl.check(self.nccl.lib.ncclCommDestroy(self.comm), "ncclCommDestroy")
            self.comm = None
