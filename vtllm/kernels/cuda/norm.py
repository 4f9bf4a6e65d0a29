"""RMSNorm on the GPU, optionally fused with the residual add. Hot path: keep it lean.

One block per row. Each thread owns the columns k = tid, tid + THREADS, ... in both passes,
so it reads back only what it wrote itself: out may be x without any barrier in between.
"""

import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._device import MAX_WARPS, SIMULATOR, block_sum
from vtllm.kernels.cuda._host import check

THREADS = 32 if SIMULATOR else 256


@cuda.jit(cache=True)
def _rms_norm_kernel(x, weight, eps, out, residual, has_residual):
    t = cuda.blockIdx.x
    H = x.shape[1]
    scratch = cuda.shared.array(MAX_WARPS, float32)
    ss = np.float32(0.0)
    for k in range(cuda.threadIdx.x, H, cuda.blockDim.x):
        v = x[t, k]
        if has_residual:
            v += residual[t, k]
            residual[t, k] = v
        ss += v * v
    ss = block_sum(ss, scratch)
    inv = np.float32(1.0) / math.sqrt(ss / np.float32(H) + eps)
    for k in range(cuda.threadIdx.x, H, cuda.blockDim.x):
        v = residual[t, k] if has_residual else x[t, k]
        out[t, k] = weight[k] * (v * inv)


def rms_norm(x, weight, eps: float, out, *, residual=None, stream=0) -> None:
    """out = v / sqrt(mean(v*v) + eps) * weight, row by row, where v = x, or, with residual,
    v = residual <- x + residual (updated in place first). out may be x. Device arrays."""
    check("rms_norm", "x", x, np.float32, 2)
    check("rms_norm", "weight", weight, np.float32, 1, (x.shape[1],))
    check("rms_norm", "out", out, np.float32, 2, x.shape)
    if residual is not None:
        check("rms_norm", "residual", residual, np.float32, 2, x.shape)
    if x.shape[0] == 0 or x.shape[1] == 0:
        return
    dummy = out if residual is None else residual  # never read when has_residual is False
    _rms_norm_kernel[x.shape[0], THREADS, stream](
        x, weight, np.float32(eps), out, dummy, residual is not None
    )
