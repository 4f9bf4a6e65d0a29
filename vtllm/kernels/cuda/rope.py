"""Rotary position embedding on the GPU (NeoX / HF rotate_half layout), in place on q and k.

One block per token; threads stride over (head, i < D/2) pairs of q, then of k. Each pair is
read and written by one thread, so no barrier is needed.
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR
from vtllm.kernels.cuda._host import check
from vtllm.kernels.cuda._ptx import grid_dependency_sync
from vtllm.kernels.rope_table import rope_cos_sin  # the host table, copied to the device once

__all__ = ["rope_cos_sin", "rotary"]

THREADS = 32 if SIMULATOR else 128


@cuda.jit(device=True)
def _rotate(x, t, h, i, cos_sin, p, half):
    c = cos_sin[p, i]
    s = cos_sin[p, half + i]
    x1 = x[t, h, i]
    x2 = x[t, h, half + i]
    x[t, h, i] = x1 * c - x2 * s
    x[t, h, half + i] = x2 * c + x1 * s


@cuda.jit(cache=True)
def _rotary_kernel(q, k, positions, cos_sin):
    grid_dependency_sync()
    t = cuda.blockIdx.x
    p = positions[t]
    if p < 0 or p >= cos_sin.shape[0]:  # padding (-1) or a bad position: left as is
        return
    half = q.shape[2] // 2
    nq = q.shape[1] * half
    for j in range(cuda.threadIdx.x, nq + k.shape[1] * half, cuda.blockDim.x):
        if j < nq:
            _rotate(q, t, j // half, j % half, cos_sin, p, half)
        else:
            _rotate(k, t, (j - nq) // half, (j - nq) % half, cos_sin, p, half)


def rotary(q, k, positions, cos_sin, *, stream=0) -> None:
    """Rotates q [T, Hq, D] and k [T, Hk, D] in place by cos_sin[positions] ([max_pos, D]:
    cos in [:, :D/2], sin in [:, D/2:]): x[i], x[i+D/2] <- x1*cos - x2*sin, x2*cos + x1*sin.
    Tokens whose position is outside [0, max_pos) (padding is -1) are skipped, not checked."""
    check("rotary", "q", q, np.float32, 3)
    check("rotary", "k", k, np.float32, 3)
    t, _, d = q.shape
    if k.shape[0] != t or k.shape[2] != d or d % 2:
        raise ValueError(f"rotary: q {q.shape} and k {k.shape} need the same T and an even D")
    check("rotary", "positions", positions, np.int32, 1, (t,))
    check("rotary", "cos_sin", cos_sin, np.float32, 2)
    if cos_sin.shape[1] != d:
        raise ValueError(f"rotary: cos_sin must be [max_pos, {d}], got {cos_sin.shape}")
    if t == 0 or d == 0:
        return
    _rotary_kernel[t, THREADS, stream](q, k, positions, cos_sin)
