"""out = x @ W.T (+ bias) for K-quant weights (Q2_K .. Q6_K) with int8 activations: the `fast`
numerics, after llama.cpp's q8_K dot products. Hot path: keep it lean.

Each row of x is quantized per 256-block (q8_K): d = max|x| / 127, q = round(x / d) (half
away from zero) in [-127, 127], and the sums of q over each 16-value chunk. A super-block's
weights against it are integers up to one conversion (_kq8simd: isum, and msum for the types
with minimums), so each output is, per super-block s in order:

    acc = fma(float(isum_s), d_w * d_x, acc)            (16 lanes)
    acc = fma(float(msum_s), -(dmin_w * d_x), acc)      (Q2_K, Q4_K, Q5_K)
    out[m, n] = hsum(acc) + bias[n]

one fixed sequence whatever M, the path (GEMV on the stored blocks, or GEMM over a tile
unpacked once) or the thread count: batch-invariant to the bit. One GEMV/GEMM pair per
type, compiled when the fast table first meets a weight of that type (linear_kq.compile_once).
"""

import numpy as np
from numba import njit, prange
from numba.core.types import float32 as f32
from numba.core.types import int64 as i64
from numba.core.types import uint8 as u8
from numba.core.types import void

from vtllm import kernels as kernels_pkg
from vtllm.kernels.cpu import _int8simd, _simd, kquant, linear_int8, linear_kq
from vtllm.kernels.cpu import _kq8simd as kq
from vtllm.kernels.cpu._int8simd import itof, prefetch
from vtllm.kernels.cpu._simd import (
    carray,
    hsum,
    hsum16,
    ld_f16,
    vfma,
    vload,
    vsplat,
    vstore,
    vzero,
)
from vtllm.kernels.cpu.kquant import (
    BB_Q2_K,
    BB_Q3_K,
    BB_Q4_K,
    BB_Q5_K,
    BB_Q6_K,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
)
from vtllm.kernels.cpu.linear_int8 import MC, MR, NR, PF_BYTES, tile_rows_for
from vtllm.kernels.cpu.linear_kq import compile_once, stamp_all

GEMM_MIN_M = 4
_ARGS = (carray(f32, 2, True), carray(u8, 2, True), carray(f32, 1, True), carray(f32, 2), i64)
_SIG = void(*_ARGS)  # x, w bytes, bias (empty: none), out, threads (GEMV) / tile rows (GEMM)


def _wrap(kind):
    """The type's intrinsics as inline functions (what the kernel bodies take as arguments)."""
    raw_isum, raw_msum = kq.isum_raw(kind), kq.msum_raw(kind)
    tile_isum, unpack_sb = kq.isum_tile(kind), kq.unpack(kind)

    @njit(inline="always")
    def isum(w, sb, xq, xo, xb, bo):
        return raw_isum(w, sb, xq, xo, xb, bo)

    @njit(inline="always")
    def msum(w, sb, xb, bo):
        return raw_msum(w, sb, xb, bo)

    @njit(inline="always")
    def tile(tb, to, ts, so, xq, xo, xb, bo):
        return tile_isum(tb, to, ts, so, xq, xo, xb, bo)

    @njit(inline="always")
    def unpack(w, sb, tb, to, ts, so):
        unpack_sb(w, sb, tb, to, ts, so)

    return isum, msum, tile, unpack


@njit(inline="always")
def _quantize_row(x, m, xq, xd, xb):
    """Row m of x (float32 [M, K], K % 256 == 0) as q8_K: xq [M, K] int8, xd [M, K/256] d,
    xb [M, K/16] int32 chunk sums. Reads only row m: independent of the batch."""
    for s in range(x.shape[1] // 256):
        o = s * 256
        amax = np.float32(0.0)
        for j in range(256):
            amax = max(amax, abs(x[m, o + j]))
        d = amax / np.float32(127.0)
        inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
        for c in range(16):
            total = 0
            for j in range(o + 16 * c, o + 16 * c + 16):
                v = x[m, j] * inv
                q = np.int32(min(np.floor(abs(v) + np.float32(0.5)), np.float32(127.0)))
                q = -q if v < 0 else q
                xq[m, j] = q
                total += q
            xb[m, s * 16 + c] = total
        xd[m, s] = d


@njit(inline="always")
def _scratch(x):
    M, K = x.shape
    return (
        np.empty((M, K), np.int8),
        np.empty((M, K // 256), np.float32),
        np.empty((M, K // 16), np.int32),
    )


@njit(inline="always")
def _step(acc, isum, dw, dx):
    return vfma(itof(isum), vsplat(dw * dx), acc)


@njit(inline="always")
def _sb(w, sb, xq, xo, xb, bo, dx, acc, isum, msum, doff, moff):
    """acc advanced by the stored super-block at byte sb against one of x (xo, bo, dx)."""
    acc = _step(acc, isum(w, sb, xq, xo, xb, bo), ld_f16(w, sb + doff), dx)
    if moff >= 0:
        acc = _step(acc, msum(w, sb, xb, bo), -ld_f16(w, sb + moff), dx)
    return acc


@njit(inline="always")
def _put(out, bias, m, n, acc):
    if n < out.shape[1]:
        y = hsum(acc)
        if bias.shape[0]:
            y += bias[n]
        out[m, n] = y


@njit(inline="always")
def _gemv(x, w, bias, out, nthr, isum, msum, bb, doff, moff):
    """The GEMV for one type (its intrinsics, block bytes, offsets of d and dmin: -1 none)."""
    xq, xd, xb = _scratch(x)
    for m in range(x.shape[0]):
        _quantize_row(x, m, xq, xd, xb)
    N, nsb, rb = out.shape[1], x.shape[1] // 256, w.shape[1]
    nblk = (N + NR - 1) // NR
    per = (nblk + nthr - 1) // nthr
    for t in prange(nthr):  # one run of 4-row blocks per thread, prefetched ahead (linear_int8)
        b0, b1 = t * per, min(nblk, (t + 1) * per)
        end = min(b1 * NR, N) * rb
        for blk in range(b0, b1):
            n0 = blk * NR
            r0, r1 = n0 * rb, min(n0 + 1, N - 1) * rb
            r2, r3 = min(n0 + 2, N - 1) * rb, min(n0 + 3, N - 1) * rb
            for c in range(r0 + NR * rb + PF_BYTES, min(r0 + 2 * NR * rb + PF_BYTES, end), 64):
                prefetch(w, c)
            for m in range(x.shape[0]):  # 4 rows of W share each activation load
                a0 = a1 = a2 = a3 = vzero()
                for s in range(nsb):
                    xo, bo, dx, o = (m * nsb + s) * 256, (m * nsb + s) * 16, xd[m, s], s * bb
                    a0 = _sb(w, r0 + o, xq, xo, xb, bo, dx, a0, isum, msum, doff, moff)
                    a1 = _sb(w, r1 + o, xq, xo, xb, bo, dx, a1, isum, msum, doff, moff)
                    a2 = _sb(w, r2 + o, xq, xo, xb, bo, dx, a2, isum, msum, doff, moff)
                    a3 = _sb(w, r3 + o, xq, xo, xb, bo, dx, a3, isum, msum, doff, moff)
                _put(out, bias, m, n0, a0)
                _put(out, bias, m, n0 + 1, a1)
                _put(out, bias, m, n0 + 2, a2)
                _put(out, bias, m, n0 + 3, a3)


@njit(inline="always")
def _gemm(x, w, bias, out, tile_rows, tile, unpack, bb, doff, moff):
    """The GEMM for one type: each task unpacks a tile of W once (bytes, S and M lanes, d and
    -dmin) and runs every (x row, tile row) pair of its panel in 4x4 blocks."""
    xq, xd, xb = _scratch(x)
    for m in prange(x.shape[0]):
        _quantize_row(x, m, xq, xd, xb)
    M, K = x.shape
    N, nsb = out.shape[1], K // 256
    n_panels = (M + MC - 1) // MC
    for task in prange((N + tile_rows - 1) // tile_rows * n_panels):
        nt = task // n_panels
        n0 = nt * tile_rows
        nc = min(tile_rows, N - n0)
        m0 = (task - nt * n_panels) * MC
        tb = np.empty(nc * nsb * 256, np.uint8)  # per-task scratch: W rows n0..n0+nc unpacked
        ts = np.empty(nc * nsb * 32, np.int32)
        td = np.empty(nc * nsb * 2, np.float32)
        for i in range(nc):
            for s in range(nsb):
                sb, t = (n0 + i) * w.shape[1] + s * bb, i * nsb + s
                unpack(w, sb, tb, t * 256, ts, t * 32)
                td[2 * t] = ld_f16(w, sb + doff)
                td[2 * t + 1] = -ld_f16(w, sb + moff) if moff >= 0 else np.float32(0.0)
        acc = np.empty(MR * NR * 16, np.float32)  # the 4x4 block's lanes, kept in L1
        sums = np.empty(MR * NR, np.float32)
        for mb in range(m0, min(M, m0 + MC), MR):
            for nb in range(0, nc, NR):
                _block(
                    M, nsb, mb, nb, nc, n0, tb, ts, td, xq, xd, xb, bias, out, acc, sums, tile, moff
                )


@njit(inline="always")
def _block(M, nsb, mb, nb, nc, n0, tb, ts, td, xq, xd, xb, bias, out, acc, sums, tile, moff):
    """out[mb:mb+4, n0+nb : n0+nb+4]; rows and columns past the edge computed on clamped
    indices and dropped. Per pair, super-block by super-block, the GEMV's float steps."""
    for k in range(MR * NR * 16):
        acc[k] = 0.0
    for s in range(nsb):
        for i in range(MR):
            xm = min(mb + i, M - 1)
            xo, bo, dx = (xm * nsb + s) * 256, (xm * nsb + s) * 16, xd[xm, s]
            for j in range(NR):
                t = min(nb + j, nc - 1) * nsb + s
                a = vload(acc, (i * NR + j) * 16)
                a = _step(a, tile(tb, t * 256, ts, t * 32, xq, xo, xb, bo), td[2 * t], dx)
                if moff >= 0:
                    a = _step(a, kq.msum_tile(ts, t * 32, xb, bo), td[2 * t + 1], dx)
                vstore(acc, (i * NR + j) * 16, a)
    a = acc  # the 16 lane sums at once, each bit-equal to hsum(lanes) as _put computes it
    vstore(
        sums,
        0,
        hsum16(
            vload(a, 0),
            vload(a, 16),
            vload(a, 32),
            vload(a, 48),
            vload(a, 64),
            vload(a, 80),
            vload(a, 96),
            vload(a, 112),
            vload(a, 128),
            vload(a, 144),
            vload(a, 160),
            vload(a, 176),
            vload(a, 192),
            vload(a, 208),
            vload(a, 224),
            vload(a, 240),
        ),
    )
    n = n0 + nb
    for i in range(MR):
        for j in range(NR):
            if mb + i < M and n + j < out.shape[1]:
                y = sums[i * NR + j]
                if bias.shape[0]:
                    y += bias[n + j]
                out[mb + i, n + j] = y


_q2, _q3, _q4, _q5, _q6 = (_wrap(k) for k in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k"))
_i2, _m2, _t2, _u2 = _q2
_i3, _m3, _t3, _u3 = _q3
_i4, _m4, _t4, _u4 = _q4
_i5, _m5, _t5, _u5 = _q5
_i6, _m6, _t6, _u6 = _q6
_JIT = dict(nogil=True, parallel=True, cache=True)


@njit(**_JIT)
def _gemv_q4k(x, w, bias, out, nthr):
    _gemv(x, w, bias, out, nthr, _i4, _m4, BB_Q4_K, 0, 2)


@njit(**_JIT)
def _gemm_q4k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, _t4, _u4, BB_Q4_K, 0, 2)


@njit(**_JIT)
def _gemv_q5k(x, w, bias, out, nthr):
    _gemv(x, w, bias, out, nthr, _i5, _m5, BB_Q5_K, 0, 2)


@njit(**_JIT)
def _gemm_q5k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, _t5, _u5, BB_Q5_K, 0, 2)


@njit(**_JIT)
def _gemv_q6k(x, w, bias, out, nthr):
    _gemv(x, w, bias, out, nthr, _i6, _m6, BB_Q6_K, 208, -1)


@njit(**_JIT)
def _gemm_q6k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, _t6, _u6, BB_Q6_K, 208, -1)


@njit(**_JIT)
def _gemv_q3k(x, w, bias, out, nthr):
    _gemv(x, w, bias, out, nthr, _i3, _m3, BB_Q3_K, 108, -1)


@njit(**_JIT)
def _gemm_q3k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, _t3, _u3, BB_Q3_K, 108, -1)


@njit(**_JIT)
def _gemv_q2k(x, w, bias, out, nthr):
    _gemv(x, w, bias, out, nthr, _i2, _m2, BB_Q2_K, 80, 82)


@njit(**_JIT)
def _gemm_q2k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, _t2, _u2, BB_Q2_K, 80, 82)


_BY_TYPE = {
    Q4_K: (_gemv_q4k, _gemm_q4k),
    Q5_K: (_gemv_q5k, _gemm_q5k),
    Q6_K: (_gemv_q6k, _gemm_q6k),
    Q3_K: (_gemv_q3k, _gemm_q3k),
    Q2_K: (_gemv_q2k, _gemm_q2k),
}


stamp_all(_BY_TYPE, (kernels_pkg, _simd, _int8simd, kq, kquant, linear_int8, linear_kq))


def kernels(qtype: int) -> tuple:
    """(GEMV, GEMM) for K-quant type qtype, compiled on first use."""
    return compile_once(_BY_TYPE, qtype, (_SIG, _SIG))


def linear_kq8(x, wb, qtype: int, bias, out, threads: int) -> None:
    """The kernels after the launcher's checks (linear_int8.linear_int8 calls this)."""
    m, n = out.shape
    gemv, gemm = kernels(qtype)
    if m < GEMM_MIN_M:
        gemv(x, wb, bias, out, threads)
    else:
        gemm(x, wb, bias, out, tile_rows_for(m, n, threads))
