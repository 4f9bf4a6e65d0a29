"""out = x @ W.T (+ bias) for Q4_0 / Q4_1 / Q8_0 weights with int8 activations (the `fast`
numerics). Hot path: keep it lean.

Each row of x is quantized per 32-block to int8 (quant_int8). A pair of blocks is one
512-bit vpdpbusd: 64 unsigned weight bytes (Q4 nibbles as they are; Q8_0 plus 128) times 64
signed activation bytes, accumulated into 16 int32 lanes (8 per block) that start at the
activation's correction (-8 S for Q4_0, -128 S for Q8_0). Exact integers so far; then one
float multiply per block and one FMA per pair:

    acc = 16 zero float lanes
    for each pair p, in order:   acc = fma(float(D_p), d_w x d_x, acc)         (lane-wise)
    Q4_1, each 16 blocks g:      acc = fma(m_w[g's 16 blocks], d_x S [same], acc)
    out[m, n] = hsum(acc) + bias[n]

That is one fixed sequence per output element whatever M, the other rows, the path (GEMV /
GEMM tile) or the thread count, so results are batch-invariant to the bit, as in linear.py.
Small M runs `_gemv_kernel` (weights unpacked in registers, 4 rows of W per activation pair
load, W prefetched PF_BYTES ahead: at batch 1 it streams from DRAM); larger M runs
`_gemm_kernel`, where each task unpacks a tile of W once into scratch (bytes, scale lanes, min
lanes) and a register-blocked microkernel sweeps a panel of x in blocks of 4 x 4 outputs: all
16 accumulators at once with AVX-512, one row of W (4 accumulators) at a time elsewhere
(NARROW: AVX2's 16 ymm hold only 8 of the 16-lane vectors).
Quantizing x happens inside the same call (a prange over rows in the GEMM).

What LLVM should emit (`inspect_asm` of the GEMV compiled without the cache, on an
AVX512-VNNI host): per pair and W row one `vpdpbusd zmm`, one `vcvtdq2ps zmm`, one
`vmulps` and one `vfmadd231ps zmm`; Q4 nibbles unpack with vbroadcasti128 / vinserti64x4,
vpsrlw and a masked byte merge + vpandq; f16 scales with vcvtsh2ss + vpermt2ps. A plain numba
loop over int8 gives none of vpdpbusd / vpmaddubsw / vpmaddwd (LLVM widens to int32 with
vpmovzxbd and multiplies 32-bit lanes), hence the explicit intrinsics in _int8simd; without
VNNI they are vpmaddubsw + vpmaddwd (AVX-512BW, or AVX2 on 256-bit halves, where every
16-lane vector here becomes two ymm) or generic IR, by the compile target's features (see
_int8simd). test_llvm_emits_vpdpbusd and tests/kernels/test_int8_variants.py check them.
"""

import numba
import numpy as np
from numba import njit, prange
from numba.core.types import float32 as f32
from numba.core.types import int64 as i64
from numba.core.types import uint8 as u8
from numba.core.types import void

from vtllm.kernels import QK, QType
from vtllm.kernels.cpu._int8simd import (
    INT8_VARIANT,
    dpbusd,
    dpbusd_small,
    itof,
    izero,
    load_b64,
    load_i16,
    min16,
    prefetch,
    q4_pair,
    q5_pair,
    q8_pair,
    scale_pair,
    store_b64,
)
from vtllm.kernels.cpu._simd import carray, hsum, hsum16, vfma, vload, vmul, vstore, vzero
from vtllm.kernels.cpu.linear import linear_args
from vtllm.kernels.cpu.quant import BB_Q4_0, BB_Q4_1, BB_Q8_0, Q4_0, Q4_1, Q8_0
from vtllm.kernels.cpu.quant_int8 import num_groups, num_pairs, quantize_row

# Q5_0 / Q5_1 go through this module's inline pieces too, in their own kernels (linear_q5)
Q5_0, Q5_1 = int(QType.Q5_0), int(QType.Q5_1)

GEMM_MIN_M = 4  # from here tiles of unpacked W pay for themselves (BENCHMARKS.md, CPU engine)
MR = 4  # microkernel rows of x (fixed by the code of _micro)
NR = 4  # microkernel rows of W (fixed by the code of _micro and _gemv_kernel)
# The microkernel's register tile follows the compile target, as the dot product does: the
# 4 x 4 tile keeps 16 accumulators of 16 float lanes and 4 weight vectors in registers, which
# fits AVX-512's 32 zmm. Where a 16-lane vector takes two registers or more (AVX2: two of its
# 16 ymm) that spills in the hot loop, so there the 4 x 4 block is swept one row of W at a
# time (4 x 1: 4 accumulators). Same steps per output element in the same order: same bits.
NARROW = INT8_VARIANT not in ("vnni512", "avx512bw")
NC = 64  # rows of W per unpacked tile / task (halved down to NC_MIN while tasks are too few)
NC_MIN = 16
TASKS_PER_THREAD = 4
MC = 64  # rows of x per task
# The GEMV prefetches W this many bytes ahead of the 4 rows it reads. At batch 1 the weights
# stream from DRAM and the hardware prefetchers alone leave the unpacking waiting on memory.
# The distance is not critical: a few KiB either way do about as well.
PF_BYTES = 8192

_ARGS = (carray(f32, 2, True), carray(u8, 2, True), i64, carray(f32, 1, True), carray(f32, 2))
# x, w bytes, qtype, bias (empty: none), out, then threads (GEMV) or rows of W per tile (GEMM)
_SIG = void(*_ARGS, i64)
QUANTIZED = (QType.Q4_0, QType.Q4_1, QType.Q8_0)
# K-quants with int8 kernels (linear_kq8, compiled on first use; Q8_K is an activation
# format), and Q5_0 / Q5_1 (linear_q5, likewise)
KQUANT_INT8 = (QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K)
Q5_INT8 = (QType.Q5_0, QType.Q5_1)


@njit(inline="always")
def _layout(qt):
    """(bytes per block, offset of the quants inside a block)."""
    if qt == Q4_1:
        return BB_Q4_1, 4
    if qt == Q5_0:
        return 22, 6
    if qt == Q5_1:
        return 24, 8
    if qt == Q4_0:
        return BB_Q4_0, 2
    return BB_Q8_0, 2


@njit(inline="always")
def _wpair(w, qt, oa, ob, hdr):
    if qt == Q4_0 or qt == Q4_1:
        return q4_pair(w, oa + hdr, ob + hdr)
    if qt == Q5_0 or qt == Q5_1:
        return q5_pair(w, oa + hdr, ob + hdr)
    return q8_pair(w, oa + hdr, ob + hdr)


@njit(inline="always")
def _step(qt, wb, dw, xb, dx, xc, acc):
    """One pair's contribution, the same ops in the GEMV and the GEMM microkernel. qt is a
    constant where this is inlined, so only one branch is compiled: Q8_0's weight bytes (plus
    128) reach 255, the others' stay below 32 (dpbusd_small: fewer ops without VNNI)."""
    if qt == Q8_0:
        dots = dpbusd(xc, wb, xb)
    else:
        dots = dpbusd_small(xc, wb, xb)
    return vfma(itof(dots), vmul(dw, dx), acc)


@njit(inline="always")
def _xpair(qt, xq, xd, xc, xp):
    """Activation pair xp (flat index): bytes, scale lanes and correction lanes. Types without
    a correction (Q4_1, Q5_1: their xc lanes are 0) get zero lanes instead of a load: the
    same integers, and one add fewer per dot where it is not VNNI's."""
    c = izero() if _has_min(qt) else load_i16(xc, xp * 16)
    return load_b64(xq, xp * 64), vload(xd, xp * 16), c


@njit(inline="always")
def _scratch(x):
    """x's quantized form (quant_int8's layout), allocated inside the call: cheaper than
    passing four more arrays from Python."""
    M, K = x.shape
    P, G = num_pairs(K), num_groups(K)
    xq = np.empty((M, P * 64), np.int8)
    xd = np.empty((M, P * 16), np.float32)
    return xq, xd, np.empty((M, P * 16), np.int32), np.empty((M, G * 16), np.float32)


@njit(inline="always")
def _corr(qt):
    if qt == Q5_0:
        return 16
    return 8 if qt == Q4_0 else (0 if _has_min(qt) else 128)


@njit(inline="always")
def _has_min(qt):
    """Block minimums (an f16 at byte 2 of each block) to add: Q4_1, Q5_1."""
    return qt == Q4_1 or qt == Q5_1


@njit(inline="always")
def _dot4(w, qt, r0, r1, r2, r3, nb, P, xq, xd, xc, xs, m):
    bb, hdr = _layout(qt)
    a0 = a1 = a2 = a3 = vzero()
    for p in range(P):
        xb, dx, c = _xpair(qt, xq, xd, xc, m * P + p)
        oa = 2 * p * bb
        ob = min(2 * p + 1, nb - 1) * bb
        wb = _wpair(w, qt, r0 + oa, r0 + ob, hdr)
        a0 = _step(qt, wb, scale_pair(w, r0 + oa, r0 + ob), xb, dx, c, a0)
        wb = _wpair(w, qt, r1 + oa, r1 + ob, hdr)
        a1 = _step(qt, wb, scale_pair(w, r1 + oa, r1 + ob), xb, dx, c, a1)
        wb = _wpair(w, qt, r2 + oa, r2 + ob, hdr)
        a2 = _step(qt, wb, scale_pair(w, r2 + oa, r2 + ob), xb, dx, c, a2)
        wb = _wpair(w, qt, r3 + oa, r3 + ob, hdr)
        a3 = _step(qt, wb, scale_pair(w, r3 + oa, r3 + ob), xb, dx, c, a3)
    if _has_min(qt):  # the block minimums' term, 16 blocks per FMA
        G = xs.shape[1] // 16
        for g in range(G):
            sv = vload(xs, (m * G + g) * 16)
            o, cnt = g * 16 * bb, nb - g * 16
            a0 = vfma(min16(w, r0 + o, bb, cnt), sv, a0)
            a1 = vfma(min16(w, r1 + o, bb, cnt), sv, a1)
            a2 = vfma(min16(w, r2 + o, bb, cnt), sv, a2)
            a3 = vfma(min16(w, r3 + o, bb, cnt), sv, a3)
    return a0, a1, a2, a3


@njit(inline="always")
def _put(out, bias, m, n, acc):
    y = hsum(acc)
    if bias.shape[0]:
        y += bias[n]
    out[m, n] = y


@njit(inline="always")
def _gemv_block(x, w, qt, bias, out, xq, xd, xc, xs, blk, nb, P, rb, end):
    """out[:, 4 blk : 4 blk + 4] for every row of x; prefetches W PF_BYTES ahead (to `end`)."""
    M, N = x.shape[0], out.shape[1]
    n0 = blk * NR
    r0 = n0 * rb
    r1 = min(n0 + 1, N - 1) * rb
    r2 = min(n0 + 2, N - 1) * rb
    r3 = min(n0 + 3, N - 1) * rb
    for c in range(r0 + NR * rb + PF_BYTES, min(r0 + 2 * NR * rb + PF_BYTES, end), 64):
        prefetch(w, c)
    for m in range(M):
        if qt == Q4_1:
            a0, a1, a2, a3 = _dot4(w, Q4_1, r0, r1, r2, r3, nb, P, xq, xd, xc, xs, m)
        elif qt == Q4_0:
            a0, a1, a2, a3 = _dot4(w, Q4_0, r0, r1, r2, r3, nb, P, xq, xd, xc, xs, m)
        else:
            a0, a1, a2, a3 = _dot4(w, Q8_0, r0, r1, r2, r3, nb, P, xq, xd, xc, xs, m)
        _put(out, bias, m, n0, a0)
        if n0 + 1 < N:
            _put(out, bias, m, n0 + 1, a1)
        if n0 + 2 < N:
            _put(out, bias, m, n0 + 2, a2)
        if n0 + 3 < N:
            _put(out, bias, m, n0 + 3, a3)


@njit(_SIG, nogil=True, parallel=True, cache=True)
def _gemv_kernel(x, w, qt, bias, out, nthr):
    xq, xd, xc, xs = _scratch(x)
    for m in range(x.shape[0]):  # a few rows: not worth a parallel region
        quantize_row(x, m, _corr(qt), xq, xd, xc, xs)
    M, K = x.shape
    N = out.shape[1]
    nb = K // QK
    P = xd.shape[1] // 16
    rb = w.shape[1]
    # One contiguous run of 4-row blocks per thread, so each thread can prefetch the head of
    # its run before it starts (prange's own split is not visible inside the loop).
    nblk = (N + NR - 1) // NR
    per = (nblk + nthr - 1) // nthr
    for t in prange(nthr):
        b0, b1 = t * per, min(nblk, (t + 1) * per)
        end = min(b1 * NR, N) * rb
        for c in range(b0 * NR * rb, min(b0 * NR * rb + PF_BYTES, end), 64):
            prefetch(w, c)
        for blk in range(b0, b1):
            _gemv_block(x, w, qt, bias, out, xq, xd, xc, xs, blk, nb, P, rb, end)


@njit(inline="always")
def _unpack_tile(w, qt, n0, nc, nb, P, G, tb, td, tm):
    """Rows n0..n0+nc of W into tb (bytes of each pair), td (scale lanes), tm (Q4_1 minimums,
    16 blocks per vector)."""
    bb, hdr = _layout(qt)
    for i in range(nc):
        r = (n0 + i) * w.shape[1]
        for p in range(P):
            oa = r + 2 * p * bb
            ob = r + min(2 * p + 1, nb - 1) * bb
            store_b64(tb, (i * P + p) * 64, _wpair(w, qt, oa, ob, hdr))
            vstore(td, (i * P + p) * 16, scale_pair(w, oa, ob))
        if _has_min(qt):
            for g in range(G):
                vstore(tm, (i * G + g) * 16, min16(w, r + g * 16 * bb, bb, nb - g * 16))


@njit(inline="always")
def _row(qt, xq, xd, xc, xp, ws, ds, a0, a1, a2, a3):
    """One activation pair (flat pair index xp) against the 4 tile rows' pairs."""
    xb, dx, c = _xpair(qt, xq, xd, xc, xp)
    a0 = _step(qt, ws[0], ds[0], xb, dx, c, a0)
    a1 = _step(qt, ws[1], ds[1], xb, dx, c, a1)
    a2 = _step(qt, ws[2], ds[2], xb, dx, c, a2)
    a3 = _step(qt, ws[3], ds[3], xb, dx, c, a3)
    return a0, a1, a2, a3


@njit(inline="always")
def _mins(xs, xg, ms, a0, a1, a2, a3):
    """Q4_1 minimums' term: one group of 16 activation block sums (flat group index xg)."""
    sv = vload(xs, xg * 16)
    return vfma(ms[0], sv, a0), vfma(ms[1], sv, a1), vfma(ms[2], sv, a2), vfma(ms[3], sv, a3)


@njit(inline="always")
def _sweep(qt, P, t, x0, x1, x2, x3, tb, td, tm, xq, xd, xc, xs):
    """The accumulators of 4 quantized rows of x against one unpacked tile row (flat pair
    index t): _micro's steps for one column of its block, for NARROW targets."""
    a0 = a1 = a2 = a3 = vzero()
    for p in range(P):
        wb, dw = load_b64(tb, (t + p) * 64), vload(td, (t + p) * 16)
        a0 = _pair(qt, xq, xd, xc, x0 * P + p, wb, dw, a0)
        a1 = _pair(qt, xq, xd, xc, x1 * P + p, wb, dw, a1)
        a2 = _pair(qt, xq, xd, xc, x2 * P + p, wb, dw, a2)
        a3 = _pair(qt, xq, xd, xc, x3 * P + p, wb, dw, a3)
    if _has_min(qt):
        G = xs.shape[1] // 16
        t = t // P * G
        for g in range(G):
            mw = vload(tm, (t + g) * 16)
            a0 = vfma(mw, vload(xs, (x0 * G + g) * 16), a0)
            a1 = vfma(mw, vload(xs, (x1 * G + g) * 16), a1)
            a2 = vfma(mw, vload(xs, (x2 * G + g) * 16), a2)
            a3 = vfma(mw, vload(xs, (x3 * G + g) * 16), a3)
    return a0, a1, a2, a3


@njit(inline="always")
def _pair(qt, xq, xd, xc, xp, wb, dw, acc):
    """One activation pair (flat pair index xp) against one tile row's pair."""
    xb, dx, c = _xpair(qt, xq, xd, xc, xp)
    return _step(qt, wb, dw, xb, dx, c, acc)


@njit(inline="always")
def _corners(M, P, mb, nb, nc):
    """The block's 4 rows of x and flat pair indices of its 4 tile rows (past an edge: the
    last one again, its results dropped)."""
    x1, x2, x3 = min(mb + 1, M - 1), min(mb + 2, M - 1), min(mb + 3, M - 1)
    t1, t2, t3 = min(nb + 1, nc - 1) * P, min(nb + 2, nc - 1) * P, min(nb + 3, nc - 1) * P
    return mb, x1, x2, x3, nb * P, t1, t2, t3


@njit(inline="always")
def _micro_wide(qt, M, P, mb, nb, nc, n0, tb, td, tm, xq, xd, xc, xs, bias, out, sums):
    """out[mb:mb+4, n0+nb : n0+nb+4] from 4 quantized rows of x and 4 unpacked tile rows."""
    x0, x1, x2, x3, t0, t1, t2, t3 = _corners(M, P, mb, nb, nc)
    a00 = a01 = a02 = a03 = a10 = a11 = a12 = a13 = vzero()
    a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = vzero()
    for p in range(P):
        ws = (
            load_b64(tb, (t0 + p) * 64),
            load_b64(tb, (t1 + p) * 64),
            load_b64(tb, (t2 + p) * 64),
            load_b64(tb, (t3 + p) * 64),
        )
        ds = (
            vload(td, (t0 + p) * 16),
            vload(td, (t1 + p) * 16),
            vload(td, (t2 + p) * 16),
            vload(td, (t3 + p) * 16),
        )
        a00, a01, a02, a03 = _row(qt, xq, xd, xc, x0 * P + p, ws, ds, a00, a01, a02, a03)
        a10, a11, a12, a13 = _row(qt, xq, xd, xc, x1 * P + p, ws, ds, a10, a11, a12, a13)
        a20, a21, a22, a23 = _row(qt, xq, xd, xc, x2 * P + p, ws, ds, a20, a21, a22, a23)
        a30, a31, a32, a33 = _row(qt, xq, xd, xc, x3 * P + p, ws, ds, a30, a31, a32, a33)
    if _has_min(qt):
        G = xs.shape[1] // 16
        t0, t1, t2, t3 = t0 // P * G, t1 // P * G, t2 // P * G, t3 // P * G
        for g in range(G):
            ms = (
                vload(tm, (t0 + g) * 16),
                vload(tm, (t1 + g) * 16),
                vload(tm, (t2 + g) * 16),
                vload(tm, (t3 + g) * 16),
            )
            a00, a01, a02, a03 = _mins(xs, x0 * G + g, ms, a00, a01, a02, a03)
            a10, a11, a12, a13 = _mins(xs, x1 * G + g, ms, a10, a11, a12, a13)
            a20, a21, a22, a23 = _mins(xs, x2 * G + g, ms, a20, a21, a22, a23)
            a30, a31, a32, a33 = _mins(xs, x3 * G + g, ms, a30, a31, a32, a33)
    # the 16 lane sums at once, each bit-equal to hsum(a_ij) as _put computes it
    vstore(
        sums,
        0,
        hsum16(a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33),
    )
    _store(M, mb, n0 + nb, bias, out, sums)


@njit(inline="always")
def _store(M, mb, n, bias, out, sums):
    """The block's lane sums (row-major 4 x 4) plus bias into out, inside its edges."""
    for i in range(MR):
        for j in range(NR):
            if mb + i < M and n + j < out.shape[1]:
                y = sums[i * NR + j]
                if bias.shape[0]:
                    y += bias[n + j]
                out[mb + i, n + j] = y


@njit(inline="always")
def _micro_narrow(qt, M, P, mb, nb, nc, n0, tb, td, tm, xq, xd, xc, xs, bias, out, sums):
    """_micro_wide's block one tile row at a time (4 x 1): each column's 4 accumulators are
    summed (hsum, as _put) before the next column's sweep, so no finished column stays live
    in registers through the next hot loop."""
    x0, x1, x2, x3, _, _, _, _ = _corners(M, P, mb, nb, nc)
    for j in range(NR):  # a loop, not 4 inlined copies: a quarter of the code to compile
        t = min(nb + j, nc - 1) * P
        a0, a1, a2, a3 = _sweep(qt, P, t, x0, x1, x2, x3, tb, td, tm, xq, xd, xc, xs)
        sums[j] = hsum(a0)
        sums[NR + j] = hsum(a1)
        sums[2 * NR + j] = hsum(a2)
        sums[3 * NR + j] = hsum(a3)
    _store(M, mb, n0 + nb, bias, out, sums)


_micro = _micro_narrow if NARROW else _micro_wide


@njit(inline="always")
def _gemm_tiles(x, w, qt, bias, out, xq, xd, xc, xs, tile_rows):
    M, K = x.shape
    N = out.shape[1]
    nb = K // QK
    P = xd.shape[1] // 16
    n_panels = (M + MC - 1) // MC
    for task in prange((N + tile_rows - 1) // tile_rows * n_panels):
        nt = task // n_panels
        n0 = nt * tile_rows
        nc = min(tile_rows, N - n0)
        m0 = (task - nt * n_panels) * MC
        tb = np.empty(nc * P * 64, np.uint8)  # per-task scratch: W rows n0..n0+nc unpacked
        td = np.empty(nc * P * 16, np.float32)
        tm = np.empty(nc * xs.shape[1] if _has_min(qt) else 16, np.float32)
        _unpack_tile(w, qt, n0, nc, nb, P, xs.shape[1] // 16, tb, td, tm)
        sums = np.empty(MR * NR, np.float32)
        for mb in range(m0, min(M, m0 + MC), MR):
            for nb4 in range(0, nc, NR):
                _micro(qt, M, P, mb, nb4, nc, n0, tb, td, tm, xq, xd, xc, xs, bias, out, sums)


@njit(_SIG, nogil=True, parallel=True, cache=True)
def _gemm_kernel(x, w, qt, bias, out, tile_rows):
    xq, xd, xc, xs = _scratch(x)
    for m in prange(x.shape[0]):
        quantize_row(x, m, _corr(qt), xq, xd, xc, xs)
    if qt == Q4_1:
        _gemm_tiles(x, w, Q4_1, bias, out, xq, xd, xc, xs, tile_rows)
    elif qt == Q4_0:
        _gemm_tiles(x, w, Q4_0, bias, out, xq, xd, xc, xs, tile_rows)
    else:
        _gemm_tiles(x, w, Q8_0, bias, out, xq, xd, xc, xs, tile_rows)


@njit(i64(i64, i64, i64), cache=True)
def tile_rows_for(m, n, threads):
    """The GEMM's rows of W per tile: NC, halved while there are too few tasks to share."""
    tile_rows = NC
    while tile_rows > NC_MIN and -(-n // tile_rows) * -(-m // MC) < TASKS_PER_THREAD * threads:
        tile_rows //= 2
    return tile_rows


def linear_int8(x: np.ndarray, w: np.ndarray, qtype, out: np.ndarray, *, bias=None) -> None:
    """out[M, N] = int8(x)[M, K] @ W.T (+ bias[N]) for W in Q4_0 / Q4_1 / Q8_0 (see
    vtllm.kernels), or Q5_0 / Q5_1 (linear_q5), x quantized per 32-block inside the call; or
    W in Q2_K .. Q6_K, x quantized per 256-block (linear_kq8). out must not overlap x."""
    qtype = QType(qtype)
    if qtype not in QUANTIZED and qtype not in KQUANT_INT8 and qtype not in Q5_INT8:
        raise ValueError(f"linear_int8: {qtype.name} weights have no int8 kernel")
    m, n, wb, bias = linear_args("linear_int8", x, w, qtype, out, bias)
    if m == 0 or n == 0:
        return
    if qtype in KQUANT_INT8:
        from vtllm.kernels.cpu.linear_kq8 import linear_kq8

        linear_kq8(x, wb, int(qtype), bias, out, numba.get_num_threads())
        return
    if qtype in Q5_INT8:
        from vtllm.kernels.cpu.linear_q5 import linear_q5

        linear_q5(x, wb, int(qtype), bias, out, numba.get_num_threads())
        return
    if m < GEMM_MIN_M:
        _gemv_kernel(x, wb, int(qtype), bias, out, numba.get_num_threads())
        return
    _gemm_kernel(x, wb, int(qtype), bias, out, tile_rows_for(m, n, numba.get_num_threads()))
