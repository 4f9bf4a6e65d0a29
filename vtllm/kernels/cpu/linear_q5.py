"""The int8 (`fast`) linear for Q5_0 / Q5_1 weights: linear_int8's kernels for another pair of
32-weight block types. Hot path: keep it lean.

A Q5 block is a Q4 block with a fifth bit per weight (_int8simd.q5_pair unpacks both to one
unsigned byte, 0..31): Q5_0 is d * (q - 16), so its activation correction is -16 S where Q4_0's
is -8 S; Q5_1 is d * q + m, Q4_1's minimums' term as it is. Same law as linear_int8 (per pair
of blocks one vpdpbusd and one FMA, batch-invariant to the bit); these kernels only live apart
so that a model without Q5 weights never compiles them: one GEMV/GEMM pair per type, compiled
on first use (llama.cpp's K-quant mixes use Q5_0 / Q5_1 where a row is no multiple of 256).
"""

from numba import njit, prange
from numba.core.types import float32 as f32
from numba.core.types import int64 as i64
from numba.core.types import uint8 as u8
from numba.core.types import void

from vtllm import kernels as kernels_pkg
from vtllm.kernels.cpu import _int8simd, _simd, linear_int8, quant_int8
from vtllm.kernels.cpu._int8simd import prefetch
from vtllm.kernels.cpu._simd import carray
from vtllm.kernels.cpu.linear_int8 import (
    GEMM_MIN_M,
    NR,
    PF_BYTES,
    Q5_0,
    Q5_1,
    _corr,
    _dot4,
    _gemm_tiles,
    _put,
    _scratch,
    tile_rows_for,
)
from vtllm.kernels.cpu.linear_kq import compile_once, stamp_all
from vtllm.kernels.cpu.quant_int8 import quantize_row

_SIG = void(
    carray(f32, 2, True), carray(u8, 2, True), carray(f32, 1, True), carray(f32, 2), i64
)  # x, w bytes, bias (empty: none), out, threads (GEMV) / rows of W per tile (GEMM)


@njit(inline="always")
def _gemv(x, w, qt, bias, out, nthr):
    """linear_int8._gemv_kernel for one (constant) qt."""
    xq, xd, xc, xs = _scratch(x)
    for m in range(x.shape[0]):
        quantize_row(x, m, _corr(qt), xq, xd, xc, xs)
    M, K = x.shape
    N = out.shape[1]
    nb, P, rb = K // 32, xd.shape[1] // 16, w.shape[1]
    nblk = (N + NR - 1) // NR
    per = (nblk + nthr - 1) // nthr
    for t in prange(nthr):
        b0, b1 = t * per, min(nblk, (t + 1) * per)
        end = min(b1 * NR, N) * rb
        for c in range(b0 * NR * rb, min(b0 * NR * rb + PF_BYTES, end), 64):
            prefetch(w, c)
        for blk in range(b0, b1):
            n0 = blk * NR
            r0, r1 = n0 * rb, min(n0 + 1, N - 1) * rb
            r2, r3 = min(n0 + 2, N - 1) * rb, min(n0 + 3, N - 1) * rb
            for c in range(r0 + NR * rb + PF_BYTES, min(r0 + 2 * NR * rb + PF_BYTES, end), 64):
                prefetch(w, c)
            for m in range(M):
                a0, a1, a2, a3 = _dot4(w, qt, r0, r1, r2, r3, nb, P, xq, xd, xc, xs, m)
                _put(out, bias, m, n0, a0)
                if n0 + 1 < N:
                    _put(out, bias, m, n0 + 1, a1)
                if n0 + 2 < N:
                    _put(out, bias, m, n0 + 2, a2)
                if n0 + 3 < N:
                    _put(out, bias, m, n0 + 3, a3)


@njit(inline="always")
def _gemm(x, w, qt, bias, out, tile_rows):
    xq, xd, xc, xs = _scratch(x)
    for m in prange(x.shape[0]):
        quantize_row(x, m, _corr(qt), xq, xd, xc, xs)
    _gemm_tiles(x, w, qt, bias, out, xq, xd, xc, xs, tile_rows)


_JIT = dict(nogil=True, parallel=True, cache=True)


@njit(**_JIT)
def _gemv_q5_0(x, w, bias, out, nthr):
    _gemv(x, w, Q5_0, bias, out, nthr)


@njit(**_JIT)
def _gemm_q5_0(x, w, bias, out, tile_rows):
    _gemm(x, w, Q5_0, bias, out, tile_rows)


@njit(**_JIT)
def _gemv_q5_1(x, w, bias, out, nthr):
    _gemv(x, w, Q5_1, bias, out, nthr)


@njit(**_JIT)
def _gemm_q5_1(x, w, bias, out, tile_rows):
    _gemm(x, w, Q5_1, bias, out, tile_rows)


_BY_TYPE = {Q5_0: (_gemv_q5_0, _gemm_q5_0), Q5_1: (_gemv_q5_1, _gemm_q5_1)}
stamp_all(_BY_TYPE, (kernels_pkg, _simd, _int8simd, linear_int8, quant_int8))


def linear_q5(x, wb, qtype: int, bias, out, threads: int) -> None:
    """The kernels after linear_int8's checks."""
    m, n = out.shape
    gemv, gemm = compile_once(_BY_TYPE, qtype, (_SIG, _SIG))
    if m < GEMM_MIN_M:
        gemv(x, wb, bias, out, threads)
    else:
        gemm(x, wb, bias, out, tile_rows_for(m, n, threads))
