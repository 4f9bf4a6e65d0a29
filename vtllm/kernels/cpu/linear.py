"""out = x @ W.T (+ bias) with W in any QType, decoded inside the kernel. Hot path: keep it lean.

Batch invariance (bitwise) is the design constraint. Every output out[m, n] is one fixed
sequence of float32 operations, whatever M, the other rows, the code path or the thread count:

    acc = 16 zero lanes
    for each 16-wide chunk c of K, in order:  acc = fma(x[m, c], w[n, c], acc)   (lane-wise)
    y = hsum(acc)                              (one fixed tree, see _simd.hsum)
    for each k of the K % 16 tail, in order:   y = fma(x[m, k], w[n, k], y)
    out[m, n] = y + bias[n]

Small M runs `_gemv_kernel`: weights are decoded in registers and 4 rows of W share each x
load. Larger M runs `_gemm_kernel`: a tile of W is decoded once into scratch and a 4x4
register-blocked microkernel (16 accumulators) sweeps it. Both are written with the same
V16 ops and the same decoders, so they agree to the bit. Threads split output columns (and
row panels), never a reduction; rows and columns past the edge are computed on clamped
indices and dropped, so edge blocks run the same code as interior ones.
"""

import numba
import numpy as np
from numba import njit, prange
from numba.core.types import float32 as f32
from numba.core.types import int64 as i64
from numba.core.types import uint8 as u8
from numba.core.types import void

from vtllm.kernels import PER_TYPE, QType
from vtllm.kernels.cpu._int8simd import prefetch
from vtllm.kernels.cpu._simd import carray, fma32, hsum, hsum16, vfma, vload, vstore, vzero
from vtllm.kernels.cpu.quant import (
    BB_Q4_0,
    BB_Q4_1,
    BB_Q8_0,
    BF16,
    F16,
    F32,
    Q4_0,
    Q4_1,
    Q8_0,
    QK,
    dequant_row,
    float_lanes,
    float_scalar,
    item_bytes,
    q4_0_block,
    q4_1_block,
    q8_0_block,
    weight_rows,
)

# M from which the GEMM path wins (BENCHMARKS.md, CPU engine): decoding Q4 per row of x is
# dear, so tiles pay early; F32/F16/BF16 rows decode for almost nothing and the GEMV reads W
# only once.
GEMM_MIN_M = {
    QType.Q4_0: 4,
    QType.Q4_1: 4,
    QType.Q8_0: 5,
    QType.F32: 12,
    QType.F16: 12,
    QType.BF16: 12,
}
MR = 4  # microkernel rows of x (fixed by the code of _micro)
NR = 4  # microkernel rows of W (fixed by the code of _micro and _gemv_kernel)
NC = 64  # rows of W per decoded tile / task (halved down to NC_MIN while tasks are too few)
NC_MIN = 16
TASKS_PER_THREAD = 4  # enough tasks that uneven splits cost little
MC = 128  # rows of x per task: sizes the x panel that each tile sweep reuses from cache
# The GEMV prefetches W this many bytes ahead of the rows it reads: at batch 1 W streams from
# DRAM, and without it the decoding waits on memory (as in linear_int8).
PF_BYTES = 8192

_ARGS = (carray(f32, 2, True), carray(u8, 2, True), i64, carray(f32, 1, True), carray(f32, 2))
_SIG = void(*_ARGS)  # x, w bytes, qtype, bias (empty: none), out
_GEMM_SIG = void(*_ARGS, i64)  # ..., rows of W per tile
_NO_BIAS = np.zeros(0, np.float32)


@njit(inline="always")
def _qstep(w, qt, off, xl, xh, acc):
    """acc advanced by one 32-weight block: chunk 0..15 first, then 16..31."""
    if qt == Q4_1:
        lo, hi = q4_1_block(w, off)
    elif qt == Q4_0:
        lo, hi = q4_0_block(w, off)
    else:
        lo, hi = q8_0_block(w, off)
    return vfma(xh, hi, vfma(xl, lo, acc))


@njit(inline="always")
def _put_w(out, bias, m, n, acc, xf, xo, w, qt, r, k16, K):
    """out[m, n] from lanes; the tail reads W's own bytes (GEMV)."""
    y = hsum(acc)
    ib = item_bytes(qt)
    for k in range(k16, K):
        y = fma32(xf[xo + k], float_scalar(w, qt, r + k * ib), y)
    if bias.shape[0]:
        y += bias[n]
    out[m, n] = y


@njit(inline="always")
def _dot4(xf, xo, w, r0, r1, r2, r3, K, qt, bb):
    """Lanes of x[m] . w[r] for 4 rows of W. Inlined with a constant qt, so each QType gets its
    own branch-free loop (4 rows share each x load and LLVM folds the decoder choice)."""
    a0 = a1 = a2 = a3 = vzero()
    if qt == Q4_0 or qt == Q4_1 or qt == Q8_0:
        for b in range(K // QK):
            xl = vload(xf, xo + b * QK)
            xh = vload(xf, xo + b * QK + 16)
            a0 = _qstep(w, qt, r0 + b * bb, xl, xh, a0)
            a1 = _qstep(w, qt, r1 + b * bb, xl, xh, a1)
            a2 = _qstep(w, qt, r2 + b * bb, xl, xh, a2)
            a3 = _qstep(w, qt, r3 + b * bb, xl, xh, a3)
    else:
        for k in range(0, K - K % 16, 16):
            xv = vload(xf, xo + k)
            a0 = vfma(xv, float_lanes(w, qt, r0 + k * bb), a0)
            a1 = vfma(xv, float_lanes(w, qt, r1 + k * bb), a1)
            a2 = vfma(xv, float_lanes(w, qt, r2 + k * bb), a2)
            a3 = vfma(xv, float_lanes(w, qt, r3 + k * bb), a3)
    return a0, a1, a2, a3


@njit(_SIG, nogil=True, parallel=True, cache=True)
def _gemv_kernel(x, w, qt, bias, out):
    M, K = x.shape
    N = out.shape[1]
    xf = x.reshape(M * K)
    rb = w.shape[1]
    k16 = K - K % 16
    for blk in prange((N + NR - 1) // NR):
        n0 = blk * NR
        r0 = n0 * rb
        r1 = min(n0 + 1, N - 1) * rb
        r2 = min(n0 + 2, N - 1) * rb
        r3 = min(n0 + 3, N - 1) * rb
        for c in range(r0 + NR * rb + PF_BYTES, min(r0 + 2 * NR * rb + PF_BYTES, N * rb), 64):
            prefetch(w, c)  # see PF_BYTES
        for m in range(M):
            xo = m * K
            if qt == Q4_1:
                a0, a1, a2, a3 = _dot4(xf, xo, w, r0, r1, r2, r3, K, Q4_1, BB_Q4_1)
            elif qt == Q4_0:
                a0, a1, a2, a3 = _dot4(xf, xo, w, r0, r1, r2, r3, K, Q4_0, BB_Q4_0)
            elif qt == Q8_0:
                a0, a1, a2, a3 = _dot4(xf, xo, w, r0, r1, r2, r3, K, Q8_0, BB_Q8_0)
            elif qt == F32:
                a0, a1, a2, a3 = _dot4(xf, xo, w, r0, r1, r2, r3, K, F32, 4)
            elif qt == F16:
                a0, a1, a2, a3 = _dot4(xf, xo, w, r0, r1, r2, r3, K, F16, 2)
            else:
                a0, a1, a2, a3 = _dot4(xf, xo, w, r0, r1, r2, r3, K, BF16, 2)
            _put_w(out, bias, m, n0, a0, xf, xo, w, qt, r0, k16, K)
            if n0 + 1 < N:
                _put_w(out, bias, m, n0 + 1, a1, xf, xo, w, qt, r1, k16, K)
            if n0 + 2 < N:
                _put_w(out, bias, m, n0 + 2, a2, xf, xo, w, qt, r2, k16, K)
            if n0 + 3 < N:
                _put_w(out, bias, m, n0 + 3, a3, xf, xo, w, qt, r3, k16, K)


@njit(inline="always")
def _micro(xf, K, M, mb, t, nb, nc, n0, bias, out, sums):
    """out[mb:mb+4, n0+nb : n0+nb+4] from 4 rows of x and 4 decoded tile rows."""
    k16 = K - K % 16
    x0 = mb * K
    x1 = min(mb + 1, M - 1) * K
    x2 = min(mb + 2, M - 1) * K
    x3 = min(mb + 3, M - 1) * K
    t0 = nb * K
    t1 = min(nb + 1, nc - 1) * K
    t2 = min(nb + 2, nc - 1) * K
    t3 = min(nb + 3, nc - 1) * K
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = vzero()
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = vzero()
    for k in range(0, k16, 16):
        w0, w1, w2, w3 = vload(t, t0 + k), vload(t, t1 + k), vload(t, t2 + k), vload(t, t3 + k)
        xv = vload(xf, x0 + k)
        a00, a01 = vfma(xv, w0, a00), vfma(xv, w1, a01)
        a02, a03 = vfma(xv, w2, a02), vfma(xv, w3, a03)
        xv = vload(xf, x1 + k)
        a10, a11 = vfma(xv, w0, a10), vfma(xv, w1, a11)
        a12, a13 = vfma(xv, w2, a12), vfma(xv, w3, a13)
        xv = vload(xf, x2 + k)
        a20, a21 = vfma(xv, w0, a20), vfma(xv, w1, a21)
        a22, a23 = vfma(xv, w2, a22), vfma(xv, w3, a23)
        xv = vload(xf, x3 + k)
        a30, a31 = vfma(xv, w0, a30), vfma(xv, w1, a31)
        a32, a33 = vfma(xv, w2, a32), vfma(xv, w3, a33)
    # the 16 lane sums at once, each bit-equal to hsum(a_ij) as _put_w computes it
    vstore(
        sums,
        0,
        hsum16(a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33),
    )
    n = n0 + nb
    if k16 == K and mb + MR <= M and n + NR <= out.shape[1]:  # interior block, no K tail
        for i in range(MR):
            for j in range(NR):
                y = sums[i * NR + j]
                if bias.shape[0]:
                    y += bias[n + j]
                out[mb + i, n + j] = y
        return
    # finish as _put_w does: K % 16 tail in k order, then bias; drop clamped rows / columns
    for i in range(MR):
        m = mb + i
        xo = min(m, M - 1) * K
        for j in range(NR):
            if m < M and n + j < out.shape[1]:
                to = min(nb + j, nc - 1) * K
                y = sums[i * NR + j]
                for k in range(k16, K):
                    y = fma32(xf[xo + k], t[to + k], y)
                if bias.shape[0]:
                    y += bias[n + j]
                out[m, n + j] = y


@njit(_GEMM_SIG, nogil=True, parallel=True, cache=True)
def _gemm_kernel(x, w, qt, bias, out, tile_rows):
    M, K = x.shape
    N = out.shape[1]
    xf = x.reshape(M * K)
    n_panels = (M + MC - 1) // MC
    for task in prange((N + tile_rows - 1) // tile_rows * n_panels):
        nt = task // n_panels
        n0 = nt * tile_rows
        nc = min(tile_rows, N - n0)
        m0 = (task - nt * n_panels) * MC
        tile = np.empty(nc * K, np.float32)  # per-task scratch: W rows n0..n0+nc decoded
        for i in range(nc):
            dequant_row(w, qt, n0 + i, K, tile, i * K)
        sums = np.empty(MR * NR, np.float32)
        for mb in range(m0, min(M, m0 + MC), MR):
            for nb in range(0, nc, NR):
                _micro(xf, K, M, mb, tile, nb, nc, n0, bias, out, sums)


def linear_args(op: str, x, w, qtype, out, bias):
    """The checks every CPU linear launcher makes: x float32 [M, K] and out float32 [M, N],
    both C-contiguous, W = (w, qtype) against K, bias None or contiguous float32 [N].
    Returns (M, N, W as the kernels read it, bias or an empty placeholder)."""
    if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 2):
        raise ValueError(f"{op}: x must be float32 [M, K], got {getattr(x, 'dtype', x)}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{op}: x must be C-contiguous")
    m, k = x.shape
    wb = weight_rows(w, qtype, k, op)
    n = w.shape[0]
    if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (m, n)):
        raise ValueError(
            f"{op}: out must be float32 {(m, n)}, got "
            f"{getattr(out, 'dtype', out)} {getattr(out, 'shape', '')}"
        )
    if not out.flags.c_contiguous:
        raise ValueError(f"{op}: out must be C-contiguous")
    if bias is None:
        bias = _NO_BIAS
    elif not (
        isinstance(bias, np.ndarray)
        and bias.dtype == np.float32
        and bias.shape == (n,)
        and bias.flags.c_contiguous
    ):
        raise ValueError(f"{op}: bias must be contiguous float32 ({n},)")
    return m, n, wb, bias


def linear(x: np.ndarray, w: np.ndarray, qtype, out: np.ndarray, *, bias=None) -> None:
    """out[M, N] = x[M, K] @ W.T (+ bias[N]); W is (w, qtype) as in vtllm.kernels. out must not
    overlap x."""
    m, n, wb, bias = linear_args("linear", x, w, qtype, out, bias)
    if m == 0 or n == 0:
        return
    qtype = QType(qtype)
    if qtype in PER_TYPE:  # compiled on first use (see linear_kq)
        from vtllm.kernels.cpu import linear_kq

        gemv, gemm = linear_kq.kernels(int(qtype))
        if m < linear_kq.GEMM_MIN_M:
            gemv(x, wb, bias, out)
        else:
            gemm(x, wb, bias, out, _tile_rows(m, n))
        return
    if m < GEMM_MIN_M[qtype]:
        _gemv_kernel(x, wb, int(qtype), bias, out)
        return
    _gemm_kernel(x, wb, int(qtype), bias, out, _tile_rows(m, n))


def _tile_rows(m: int, n: int) -> int:
    """Rows of W per GEMM tile: NC, halved while there are too few tasks to share."""
    tile_rows = NC
    tasks_wanted = TASKS_PER_THREAD * numba.get_num_threads()
    while tile_rows > NC_MIN and -(-n // tile_rows) * -(-m // MC) < tasks_wanted:
        tile_rows //= 2
    return tile_rows
