"""out = x @ W.T (+ bias) and embedding rows for K-quant weights (Q2_K .. Q8_K) and Q5_0 /
Q5_1, float32 numerics. Hot path: keep it lean.

The same law as linear.py, whose GEMM microkernel this reuses: every output is

    acc = 16 zero lanes
    for each 16-wide chunk c of K, in order:  acc = fma(x[m, c], w[n, c], acc)   (lane-wise)
    out[m, n] = hsum(acc) + bias[n]

with w[n, c] from kquant's decoders (K is a multiple of the block: no tail). Small M runs the
GEMV (chunks decoded in registers, 4 rows of W per x load, W prefetched); larger M decodes
a tile of W once into scratch and runs linear's 4x4 microkernel. A separate module from
linear.py so that a model without K-quants never compiles these kernels: linear() and
embedding() import it on the first K-quant weight.
"""

import sys
import threading

import numpy as np
from numba import njit, prange
from numba.core.types import float32 as f32
from numba.core.types import int32 as i32
from numba.core.types import int64 as i64
from numba.core.types import uint8 as u8
from numba.core.types import void

from vtllm import kernels as kernels_pkg
from vtllm.kernels.cpu import _int8simd, _kq8simd, _simd, kquant
from vtllm.kernels.cpu._cache import stamp_with
from vtllm.kernels.cpu._int8simd import prefetch
from vtllm.kernels.cpu._simd import carray, hsum, vfma, vload, vstore, vzero
from vtllm.kernels.cpu.kquant import (
    BB_Q2_K,
    BB_Q3_K,
    BB_Q4_K,
    BB_Q5_0,
    BB_Q5_1,
    BB_Q5_K,
    BB_Q6_K,
    BB_Q8_K,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_K,
    chunk_q2k,
    chunk_q3k,
    chunk_q4k,
    chunk_q5_0,
    chunk_q5_1,
    chunk_q5k,
    chunk_q6k,
    chunk_q8k,
    kq_dequant_row,
    no_prep,
    prep_q2k,
    prep_q3k,
    prep_q4k,
    prep_q5k,
    prep_q6k,
)
from vtllm.kernels.cpu.linear import MC, MR, NR, PF_BYTES, _micro

# M from which decoding a tile once beats decoding W per row of x: K-quant chunks cost more
# to decode than Q4_1's blocks, so tiles pay as early.
GEMM_MIN_M = 4

_ARGS = (carray(f32, 2, True), carray(u8, 2, True), carray(f32, 1, True), carray(f32, 2))
_SIG = void(*_ARGS)  # x, w bytes, bias (empty: none), out
_GEMM_SIG = void(*_ARGS, i64)  # ..., rows of W per tile


@njit(inline="always")
def _put(out, bias, m, n, acc):
    if n < out.shape[1]:
        y = hsum(acc)
        if bias.shape[0]:
            y += bias[n]
        out[m, n] = y


@njit(inline="always")
def _gemv(x, w, bias, out, prep, chunk, bb, bw):
    """The GEMV for one type: its decoders (`prep` once per block, `chunk` per 16 weights),
    bytes `bb` and weights `bw` per block."""
    M, K = x.shape
    N = out.shape[1]
    xf = x.reshape(M * K)
    rb = w.shape[1]
    for blk in prange((N + NR - 1) // NR):
        n0 = blk * NR
        r0 = n0 * rb
        r1 = min(n0 + 1, N - 1) * rb
        r2 = min(n0 + 2, N - 1) * rb
        r3 = min(n0 + 3, N - 1) * rb
        for c in range(r0 + NR * rb + PF_BYTES, min(r0 + 2 * NR * rb + PF_BYTES, N * rb), 64):
            prefetch(w, c)  # see linear.PF_BYTES
        for m in range(M):  # 4 rows of W share each x load
            xo = m * K
            a0 = a1 = a2 = a3 = vzero()
            for s in range(K // bw):
                o = s * bb
                p0, p1 = prep(w, r0 + o), prep(w, r1 + o)
                p2, p3 = prep(w, r2 + o), prep(w, r3 + o)
                for c in range(bw // 16):
                    xv = vload(xf, xo + s * bw + c * 16)
                    a0 = vfma(xv, chunk(w, r0 + o, c, p0), a0)
                    a1 = vfma(xv, chunk(w, r1 + o, c, p1), a1)
                    a2 = vfma(xv, chunk(w, r2 + o, c, p2), a2)
                    a3 = vfma(xv, chunk(w, r3 + o, c, p3), a3)
            _put(out, bias, m, n0, a0)
            _put(out, bias, m, n0 + 1, a1)
            _put(out, bias, m, n0 + 2, a2)
            _put(out, bias, m, n0 + 3, a3)


@njit(inline="always")
def _gemm(x, w, bias, out, tile_rows, prep, chunk, bb, bw):
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
            r = (n0 + i) * w.shape[1]
            for s in range(K // bw):
                p = prep(w, r + s * bb)
                for c in range(bw // 16):
                    vstore(tile, i * K + s * bw + c * 16, chunk(w, r + s * bb, c, p))
        sums = np.empty(MR * NR, np.float32)
        for mb in range(m0, min(M, m0 + MC), MR):
            for nb in range(0, nc, NR):
                _micro(xf, K, M, mb, tile, nb, nc, n0, bias, out, sums)


# what the kernels here inline besides this file: their cache entries carry these files' stamps
# (the package re-exports the function `linear`, which hides the module of that name)
_HELPERS = (kernels_pkg, _simd, _int8simd, _kq8simd, kquant, sys.modules[_micro.__module__])

# One pair of kernels per type, no signature in the decorator: `kernels` compiles a type's
# pair (with the explicit signatures) when a weight of that type first comes.
_JIT = dict(nogil=True, parallel=True, cache=True)


@njit(**_JIT)
def _gemv_q4k(x, w, bias, out):
    _gemv(x, w, bias, out, prep_q4k, chunk_q4k, BB_Q4_K, 256)


@njit(**_JIT)
def _gemm_q4k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, prep_q4k, chunk_q4k, BB_Q4_K, 256)


@njit(**_JIT)
def _gemv_q5k(x, w, bias, out):
    _gemv(x, w, bias, out, prep_q5k, chunk_q5k, BB_Q5_K, 256)


@njit(**_JIT)
def _gemm_q5k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, prep_q5k, chunk_q5k, BB_Q5_K, 256)


@njit(**_JIT)
def _gemv_q6k(x, w, bias, out):
    _gemv(x, w, bias, out, prep_q6k, chunk_q6k, BB_Q6_K, 256)


@njit(**_JIT)
def _gemm_q6k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, prep_q6k, chunk_q6k, BB_Q6_K, 256)


@njit(**_JIT)
def _gemv_q3k(x, w, bias, out):
    _gemv(x, w, bias, out, prep_q3k, chunk_q3k, BB_Q3_K, 256)


@njit(**_JIT)
def _gemm_q3k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, prep_q3k, chunk_q3k, BB_Q3_K, 256)


@njit(**_JIT)
def _gemv_q2k(x, w, bias, out):
    _gemv(x, w, bias, out, prep_q2k, chunk_q2k, BB_Q2_K, 256)


@njit(**_JIT)
def _gemm_q2k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, prep_q2k, chunk_q2k, BB_Q2_K, 256)


@njit(**_JIT)
def _gemv_q8k(x, w, bias, out):
    _gemv(x, w, bias, out, no_prep, chunk_q8k, BB_Q8_K, 256)


@njit(**_JIT)
def _gemm_q8k(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, no_prep, chunk_q8k, BB_Q8_K, 256)


@njit(**_JIT)
def _gemv_q5_0(x, w, bias, out):
    _gemv(x, w, bias, out, no_prep, chunk_q5_0, BB_Q5_0, 32)


@njit(**_JIT)
def _gemm_q5_0(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, no_prep, chunk_q5_0, BB_Q5_0, 32)


@njit(**_JIT)
def _gemv_q5_1(x, w, bias, out):
    _gemv(x, w, bias, out, no_prep, chunk_q5_1, BB_Q5_1, 32)


@njit(**_JIT)
def _gemm_q5_1(x, w, bias, out, tile_rows):
    _gemm(x, w, bias, out, tile_rows, no_prep, chunk_q5_1, BB_Q5_1, 32)


_BY_TYPE = {
    Q5_0: (_gemv_q5_0, _gemm_q5_0),
    Q5_1: (_gemv_q5_1, _gemm_q5_1),
    Q4_K: (_gemv_q4k, _gemm_q4k),
    Q5_K: (_gemv_q5k, _gemm_q5k),
    Q6_K: (_gemv_q6k, _gemm_q6k),
    Q3_K: (_gemv_q3k, _gemm_q3k),
    Q2_K: (_gemv_q2k, _gemm_q2k),
    Q8_K: (_gemv_q8k, _gemm_q8k),
}
_ready: set = set()
_compiling = threading.Lock()


def stamp_all(pairs: dict, modules) -> None:
    """Every kernel of `pairs` recompiles when one of `modules` changes (see _cache)."""
    for kernels_ in pairs.values():
        for kernel in kernels_:
            stamp_with(kernel, modules)


def compile_once(pairs: dict, qtype: int, sigs: tuple) -> tuple:
    """qtype's kernels from `pairs`, compiled (or loaded from numba's cache) with `sigs` on
    the first call and then closed to other signatures, as an explicit signature would."""
    kernels_ = pairs[qtype]
    if (id(pairs), qtype) not in _ready:
        with _compiling:  # a second thread must not compile after the first closed it
            if (id(pairs), qtype) not in _ready:
                for kernel, sig in zip(kernels_, sigs, strict=True):
                    kernel.compile(sig)
                    kernel.disable_compile()
                _ready.add((id(pairs), qtype))
    return kernels_


def kernels(qtype: int) -> tuple:
    """(GEMV, GEMM) for K-quant type qtype."""
    return compile_once(_BY_TYPE, qtype, (_SIG, _GEMM_SIG))


_EMBED_SIG = i64(carray(i32, 1, True), carray(u8, 2, True), i64, carray(f32, 2))


@njit(nogil=True, cache=True)
def _embedding_kernel(token_ids, w, qt, out):
    """As embedding._embedding_kernel: -1, or the index of the first id outside the table."""
    T, K = out.shape
    for t in range(T):
        if token_ids[t] < 0 or token_ids[t] >= w.shape[0]:
            return t
    of = out.reshape(T * K)
    for t in range(T):
        kq_dequant_row(w, qt, token_ids[t], K, of, t * K)
    return -1


_EMBEDDING = {0: (_embedding_kernel,)}
stamp_all(_BY_TYPE, _HELPERS)
stamp_all(_EMBEDDING, _HELPERS)


def embedding_kernel(token_ids, w, qt, out) -> int:
    """The embedding of every type here (one kernel, compiled on first use)."""
    return compile_once(_EMBEDDING, 0, (_EMBED_SIG,))[0](token_ids, w, qt, out)
