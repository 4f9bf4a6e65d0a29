"""RMSNorm on the GPU, optionally fused with the residual add. Hot path: keep it lean.

One block per row, in chunks of THREADS x PER columns: thread tid owns the columns
c + tid + i THREADS of chunk c. Every load of a chunk is issued before the chunk's first store
(the values sit in registers), so a chunk costs one trip to memory; a loop that loads, adds
and stores one column at a time cannot hoist the next column's loads above the store (x,
residual and out may alias) and pays one trip per column. A row of one chunk keeps its values
and its weights (loaded with the values, not after the sum, so both trips overlap) in
registers for the second pass; longer rows read back what the thread wrote itself, so out may
be x without any barrier in between. The block size is a compile-time constant: sizing it
to the row at launch, with the stride read from blockDim, is slower.

row_inv_rms is the same sum for a kernel that folds the norm into its own loads (the decode
linear, _linear_mma's norm_weight): the same float operations in the same order, so the values
it scales are bitwise those rms_norm writes.
"""

import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._device import MAX_WARPS, SIMULATOR, block_sum
from vtllm.kernels.cuda._host import check
from vtllm.kernels.cuda._ptx import grid_dependency_sync

THREADS = 32 if SIMULATOR else 256
PER = 4 if SIMULATOR else 16  # columns a thread holds per chunk: 4,096 per chunk on the GPU
CHUNK = THREADS * PER


@cuda.jit(device=True)
def inv_rms(ss, n, eps):
    """1 / sqrt(mean square + eps) from a row's sum of squares ss over n columns."""
    return np.float32(1.0) / math.sqrt(ss / np.float32(n) + eps)


@cuda.jit(device=True)
def row_inv_rms(x, t, eps, scratch):
    """inv_rms of row t of x, summed as _rms_norm_kernel sums it (thread tid < THREADS
    over columns tid, tid + THREADS, ... in order, then block_sum): the same bits. Every
    thread of a block of at least THREADS threads calls it; the threads past THREADS add
    zeros after the others' sums, which changes nothing. scratch: shared [MAX_WARPS]."""
    tid = cuda.threadIdx.x
    H = x.shape[1]
    v = cuda.local.array(PER, float32)
    ss = np.float32(0.0)
    if tid < THREADS:
        for c in range(0, H, CHUNK):
            for i in range(PER):
                k = c + tid + i * THREADS
                if k < H:
                    v[i] = x[t, k]
            for i in range(PER):
                if c + tid + i * THREADS < H:
                    ss += v[i] * v[i]
    return inv_rms(block_sum(ss, scratch), H, eps)


@cuda.jit(cache=True)
def _rms_norm_kernel(x, weight, eps, out, residual, has_residual):
    grid_dependency_sync()
    t, tid = cuda.blockIdx.x, cuda.threadIdx.x
    H = x.shape[1]
    scratch = cuda.shared.array(MAX_WARPS, float32)
    v = cuda.local.array(PER, float32)  # registers: constant indices once unrolled
    r = cuda.local.array(PER, float32)
    wt = cuda.local.array(PER, float32)
    ss = np.float32(0.0)
    for c in range(0, H, CHUNK):
        for i in range(PER):
            k = c + tid + i * THREADS
            if k < H:
                v[i] = x[t, k]
                if has_residual:
                    r[i] = residual[t, k]
                if H <= CHUNK:  # the weights too, in the same trip to memory
                    wt[i] = weight[k]
        for i in range(PER):
            k = c + tid + i * THREADS
            if k < H:
                if has_residual:
                    v[i] += r[i]
                    residual[t, k] = v[i]
                ss += v[i] * v[i]
    ss = block_sum(ss, scratch)
    inv = inv_rms(ss, H, eps)
    for c in range(0, H, CHUNK):
        if H > CHUNK:  # one-chunk rows still hold their values in v and the weights in wt
            for i in range(PER):
                k = c + tid + i * THREADS
                if k < H:
                    wt[i] = weight[k]
                    v[i] = residual[t, k] if has_residual else x[t, k]
        for i in range(PER):
            k = c + tid + i * THREADS
            if k < H:
                out[t, k] = wt[i] * (v[i] * inv)


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
