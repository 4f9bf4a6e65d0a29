"""Launcher-side checks shared by the CUDA ops: device arrays only (a host array would be copied
to the device and back on every launch), dtype, rank, shape, C-contiguity. They read only
metadata, never device memory, so they never synchronize and work inside graph capture."""

import numpy as np
from numba import cuda

from vtllm.kernels import BLOCK_BYTES, QK, QType

_WEIGHT_DTYPES = {QType.F32: np.float32, QType.F16: np.float16, QType.BF16: np.uint16}
# what the kernels read: float weights as integer bits, quantized ones as bytes
_KERNEL_VIEW = {QType.F32: np.uint32, QType.F16: np.uint16, QType.BF16: np.uint16}

_empty_cache: dict = {}


def is_device_array(a) -> bool:
    return not isinstance(a, np.ndarray) and hasattr(a, "is_c_contiguous") and hasattr(a, "dtype")


def check(op: str, name: str, a, dtype, ndim: int, shape=None) -> None:
    """ValueError unless a is a C-contiguous device array of dtype, rank ndim (and shape)."""
    if not is_device_array(a):
        raise ValueError(f"{op}: {name} must be a numba.cuda device array, got {type(a).__name__}")
    if a.dtype != dtype or len(a.shape) != ndim:
        raise ValueError(
            f"{op}: {name} must be a {ndim}-D {np.dtype(dtype)} device array, got "
            f"{a.dtype} {tuple(a.shape)}"
        )
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
    if not a.is_c_contiguous():
        raise ValueError(f"{op}: {name} must be C-contiguous")


def weight_view(op: str, w, qtype, k: int):
    """Checks W = (w, qtype) against K; returns (the view the kernels read, int qtype):
    F32 as uint32 bits, F16 / BF16 as uint16 bits, Q4_0 / Q4_1 / Q8_0 block rows as uint16
    words (all three block sizes are even)."""
    try:
        qtype = QType(qtype)
    except ValueError:
        raise ValueError(f"{op}: unsupported qtype {qtype!r}") from None
    if qtype in BLOCK_BYTES:
        if k % QK:
            raise ValueError(f"{op}: {qtype.name} needs K % {QK} == 0, got K={k}")
        check(op, "weight", w, np.uint8, 2)
        if w.shape[1] != k // QK * BLOCK_BYTES[qtype]:
            raise ValueError(f"{op}: {qtype.name} weight shape {w.shape} does not match K={k}")
        return w.view(np.uint16), int(qtype)
    if qtype not in _WEIGHT_DTYPES:
        raise ValueError(
            f"{op}: {qtype.name} weights have no CUDA kernel yet (the cpu device runs them)"
        )
    check(op, "weight", w, _WEIGHT_DTYPES[qtype], 2)
    if w.shape[1] != k:
        raise ValueError(f"{op}: {qtype.name} weight shape {w.shape} does not match K={k}")
    return w.view(_KERNEL_VIEW[qtype]), int(qtype)


def aligned(a, nbytes: int) -> bool:
    """Whether a's data starts on an nbytes boundary (always so under the simulator)."""
    cai = getattr(a, "__cuda_array_interface__", None)
    return cai is None or cai["data"][0] % nbytes == 0


def placeholder(dtype, ndim: int = 1):
    """A tiny device array passed where an optional argument is absent (flagged off), made
    once per dtype so later launches (and graph capture) allocate nothing."""
    key = (np.dtype(dtype), ndim)
    if key not in _empty_cache:
        _empty_cache[key] = cuda.device_array((1,) * ndim, dtype)
    return _empty_cache[key]


def grid_blocks(n: int, per_block: int) -> int:
    return max(1, -(-n // per_block))
