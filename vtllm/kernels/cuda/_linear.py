"""out = x @ W.T (+ bias) on the GPU, W in any QType decoded inside the kernel. Hot path: keep it
lean.

A GEMV-style kernel, correct for any M: one warp per row n of W and up to MT rows of x
per block (the grid's y covers M), fp32 accumulators in registers, one warp reduction at the
end. A block whose rows of x are a single one (decode at batch 1) runs a one-row loop.
  float W, 8-byte aligned rows (F16 / BF16 with K % 4 == 0, F32 with K % 2 == 0): lane l reads
      64-bit words l, l+32, ... (4 or 2 weights each), two words in flight per step;
  float W otherwise: one weight per lane per column step, UNROLL columns in flight;
  block-quantized W (Q4_0 / Q4_1 / Q8_0, rows read as uint16 words): four lanes share a
      32-weight block, each decoding 8 weights, so a warp covers 8 consecutive blocks and its
      x reads are contiguous.
Bits: every product is added with a pinned fused multiply-add (fma32), in one fixed order per
accumulator, so a row of x gets the same bits from the one-row loop and the four-row loop
(PTX's plain mul.f32 / add.f32 leave ptxas free to contract them differently in each).
W is read once per MT rows of x: fine for decode batches, slow for prefill; bf16 weights
take the tensor-core path instead (_linear_mma, _gemm_mma). Rows past N or M are computed on
clamped indices and dropped, so every warp takes part in the reduction.
"""

import numpy as np
from numba import cuda

from vtllm.kernels import QType
from vtllm.kernels.cuda._device import (
    BB_Q4_0,
    BB_Q4_1,
    BB_Q8_0,
    F16,
    F32,
    Q4_0,
    Q4_1,
    Q8_0,
    QK,
    SIMULATOR,
    as_f32,
    bf16_to_f32,
    f16_to_f32,
    float_weight,
    fma32,
    imin,
    warp_sum4,
)
from vtllm.kernels.cuda._host import aligned, check, grid_blocks, placeholder, weight_view
from vtllm.kernels.cuda._linear_kquant import TYPES as KQUANT_TYPES
from vtllm.kernels.cuda._linear_kquant import linear_kquant
from vtllm.kernels.cuda._ptx import grid_dependency_sync

WARPS = 2 if SIMULATOR else 4  # rows of W per block, one warp each
MT = 4  # rows of x per block (fixed by the code: four accumulators)

_U16, _U32, _MASK16 = np.uint64(16), np.uint64(32), np.uint64(0xFFFF)
_MASK32 = np.uint64(0xFFFFFFFF)


@cuda.jit(device=True)
def _finish(out, bias, has_bias, n, m0, M, N, lane, a0, a1, a2, a3):
    a0, a1, a2, a3 = warp_sum4(a0, a1, a2, a3)
    if lane == 0 and n < N:
        b = bias[n] if has_bias else np.float32(0.0)
        out[m0, n] = a0 + b
        if m0 + 1 < M:
            out[m0 + 1, n] = a1 + b
        if m0 + 2 < M:
            out[m0 + 2, n] = a2 + b
        if m0 + 3 < M:
            out[m0 + 3, n] = a3 + b


@cuda.jit(device=True)
def _half(word, e, qt):
    """Weight e (0..3) of a 64-bit word of F16 or BF16 bits."""
    h = np.int64((word >> (_U16 * np.uint64(e))) & _MASK16)
    return f16_to_f32(h) if qt == F16 else bf16_to_f32(h)


@cuda.jit(device=True)
def _dot(a, x, r, k, w0, w1):
    """a advanced by x[r, k] w0, then x[r, k + 1] w1: pinned fmas (the module docstring)."""
    return fma32(x[r, k + 1], w1, fma32(x[r, k], w0, a))


@cuda.jit(device=True)
def _word(x, x0, x1, x2, x3, one, word, k, qt, a0, a1, a2, a3):
    """Accumulators advanced by the 2 (F32) or 4 (F16 / BF16) weights of word, columns k..."""
    if qt == F32:
        w0 = as_f32(word & _MASK32)
        w1 = as_f32(word >> _U32)
        a0 = _dot(a0, x, x0, k, w0, w1)
        if not one:
            a1 = _dot(a1, x, x1, k, w0, w1)
            a2 = _dot(a2, x, x2, k, w0, w1)
            a3 = _dot(a3, x, x3, k, w0, w1)
        return a0, a1, a2, a3
    w0, w1, w2, w3 = _half(word, 0, qt), _half(word, 1, qt), _half(word, 2, qt), _half(word, 3, qt)
    a0 = _dot(_dot(a0, x, x0, k, w0, w1), x, x0, k + 2, w2, w3)
    if not one:
        a1 = _dot(_dot(a1, x, x1, k, w0, w1), x, x1, k + 2, w2, w3)
        a2 = _dot(_dot(a2, x, x2, k, w0, w1), x, x2, k + 2, w2, w3)
        a3 = _dot(_dot(a3, x, x3, k, w0, w1), x, x3, k + 2, w2, w3)
    return a0, a1, a2, a3


@cuda.jit(cache=True)
def _linear_vec_kernel(x, w, qt, bias, has_bias, out):
    grid_dependency_sync()
    M = x.shape[0]
    N = out.shape[1]
    lane = cuda.threadIdx.x % 32
    n = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    r = imin(n, N - 1)
    m0 = cuda.blockIdx.y * MT
    x0, x1, x2, x3 = m0, imin(m0 + 1, M - 1), imin(m0 + 2, M - 1), imin(m0 + 3, M - 1)
    one = m0 + 1 >= M  # a single row of x here: skip the other three (same block for all warps)
    per = 2 if qt == F32 else 4
    words = w.shape[1]
    a0 = a1 = a2 = a3 = np.float32(0.0)
    c = lane
    while c + 32 < words:  # two words per lane in flight
        u = w[r, c]
        v = w[r, c + 32]
        a0, a1, a2, a3 = _word(x, x0, x1, x2, x3, one, u, c * per, qt, a0, a1, a2, a3)
        a0, a1, a2, a3 = _word(x, x0, x1, x2, x3, one, v, (c + 32) * per, qt, a0, a1, a2, a3)
        c += 64
    if c < words:
        a0, a1, a2, a3 = _word(x, x0, x1, x2, x3, one, w[r, c], c * per, qt, a0, a1, a2, a3)
    _finish(out, bias, has_bias, n, m0, M, N, lane, a0, a1, a2, a3)


@cuda.jit(device=True)
def _strided4(a, x, r, k, w0, w1, w2, w3):
    """a advanced by the weights of columns k, k + 32, k + 64, k + 96 of x's row r."""
    a = fma32(x[r, k + 32], w1, fma32(x[r, k], w0, a))
    return fma32(x[r, k + 96], w3, fma32(x[r, k + 64], w2, a))


@cuda.jit(cache=True)
def _linear_float_kernel(x, w, qt, bias, has_bias, out):
    grid_dependency_sync()
    M, K = x.shape
    N = out.shape[1]
    lane = cuda.threadIdx.x % 32
    n = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    r = imin(n, N - 1)
    m0 = cuda.blockIdx.y * MT
    x0, x1, x2, x3 = m0, imin(m0 + 1, M - 1), imin(m0 + 2, M - 1), imin(m0 + 3, M - 1)
    a0 = a1 = a2 = a3 = np.float32(0.0)
    k = lane
    while k + 96 < K:  # 4 columns per lane in flight
        w0 = float_weight(w, r, k, qt)
        w1 = float_weight(w, r, k + 32, qt)
        w2 = float_weight(w, r, k + 64, qt)
        w3 = float_weight(w, r, k + 96, qt)
        a0 = _strided4(a0, x, x0, k, w0, w1, w2, w3)
        a1 = _strided4(a1, x, x1, k, w0, w1, w2, w3)
        a2 = _strided4(a2, x, x2, k, w0, w1, w2, w3)
        a3 = _strided4(a3, x, x3, k, w0, w1, w2, w3)
        k += 128
    while k < K:
        wv = float_weight(w, r, k, qt)
        a0 = fma32(x[x0, k], wv, a0)
        a1 = fma32(x[x1, k], wv, a1)
        a2 = fma32(x[x2, k], wv, a2)
        a3 = fma32(x[x3, k], wv, a3)
        k += 32
    _finish(out, bias, has_bias, n, m0, M, N, lane, a0, a1, a2, a3)


@cuda.jit(device=True)
def _q4_word(x, x0, x1, x2, x3, one, word, c, j, d, mn, qt, a0, a1, a2, a3):
    """Two bytes of a Q4 body (weights j, j+1 and j+16, j+17 of the block at column c)."""
    for i in range(2):
        byte = (word >> (8 * i)) & 0xFF
        lo = np.float32(byte & 15)
        hi = np.float32(byte >> 4)
        if qt == Q4_0:
            wl = d * (lo - np.float32(8.0))
            wh = d * (hi - np.float32(8.0))
        else:
            wl = fma32(d, lo, mn)
            wh = fma32(d, hi, mn)
        k = c + j + i
        a0 = fma32(x[x0, k + 16], wh, fma32(x[x0, k], wl, a0))
        if not one:
            a1 = fma32(x[x1, k + 16], wh, fma32(x[x1, k], wl, a1))
            a2 = fma32(x[x2, k + 16], wh, fma32(x[x2, k], wl, a2))
            a3 = fma32(x[x3, k + 16], wh, fma32(x[x3, k], wl, a3))
    return a0, a1, a2, a3


@cuda.jit(device=True)
def _q8_word(x, x0, x1, x2, x3, one, word, k, d, a0, a1, a2, a3):
    """Two int8 weights (columns k, k+1) of a Q8_0 body word."""
    for i in range(2):
        q = (word >> (8 * i)) & 0xFF
        wv = d * np.float32(q - 256 if q > 127 else q)
        a0 = fma32(x[x0, k + i], wv, a0)
        if not one:
            a1 = fma32(x[x1, k + i], wv, a1)
            a2 = fma32(x[x2, k + i], wv, a2)
            a3 = fma32(x[x3, k + i], wv, a3)
    return a0, a1, a2, a3


@cuda.jit(cache=True)
def _linear_quant_kernel(x, w, qt, bias, has_bias, out):
    grid_dependency_sync()
    M, K = x.shape
    N = out.shape[1]
    lane = cuda.threadIdx.x % 32
    n = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    r = imin(n, N - 1)
    m0 = cuda.blockIdx.y * MT
    x0, x1, x2, x3 = m0, imin(m0 + 1, M - 1), imin(m0 + 2, M - 1), imin(m0 + 3, M - 1)
    one = m0 + 1 >= M
    sub = lane % 4  # which quarter of the block this lane decodes
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for b in range(lane // 4, K // QK, 8):
        c = b * QK
        if qt == Q8_0:
            h = b * (BB_Q8_0 // 2)  # words: scale, then 16 words of int8 pairs
            d = f16_to_f32(w[r, h])
            for e in range(4):  # this lane's 8 weights: columns c + 8 sub ...
                word = np.int32(w[r, h + 1 + 4 * sub + e])
                k = c + 8 * sub + 2 * e
                a0, a1, a2, a3 = _q8_word(x, x0, x1, x2, x3, one, word, k, d, a0, a1, a2, a3)
        else:
            if qt == Q4_0:
                h = b * (BB_Q4_0 // 2)  # words: scale, 8 words of nibbles
                mn = np.float32(0.0)  # Q4_0 has no offset: it decodes d * (q - 8)
                body = h + 1
            else:
                h = b * (BB_Q4_1 // 2)  # words: scale, min, 8 words of nibbles
                mn = f16_to_f32(w[r, h + 1])
                body = h + 2
            d = f16_to_f32(w[r, h])
            for e in range(2):  # this lane's bytes 4 sub .. 4 sub + 3: weights j, j + 16
                word = np.int32(w[r, body + 2 * sub + e])
                j = 4 * sub + 2 * e
                a0, a1, a2, a3 = _q4_word(
                    x, x0, x1, x2, x3, one, word, c, j, d, mn, qt, a0, a1, a2, a3
                )
    _finish(out, bias, has_bias, n, m0, M, N, lane, a0, a1, a2, a3)


def linear(x, w, qtype, out, *, bias=None, col0=0, stream=0) -> None:
    """out[M, N] = x[M, K] @ W.T (+ bias[N]); W is (w, qtype) as in vtllm.kernels. Device arrays;
    out must not overlap x. col0 (K-quant and Q5 types only, _linear_kquant): out is [M, >= col0
    + N] and the product lands in its columns col0.., adding bias[col0 + n]."""
    check("linear", "x", x, np.float32, 2)
    m, k = x.shape
    wv, qt = weight_view("linear", w, qtype, k)
    n = w.shape[0]
    if qt in KQUANT_TYPES:
        check("linear", "out", out, np.float32, 2)
        if out.shape[0] != m or out.shape[1] < col0 + n:
            raise ValueError(
                f"linear: out {tuple(out.shape)} cannot take [{m}, {n}] at column {col0}"
            )
        if bias is not None:
            check("linear", "bias", bias, np.float32, 1, (out.shape[1],))
        if m and n:
            linear_kquant(x, w, qt, out, bias, col0, stream)
        return
    if col0:
        raise ValueError(f"linear: col0 needs a K-quant or Q5 weight, got {QType(qt).name}")
    check("linear", "out", out, np.float32, 2, (m, n))
    if bias is not None:
        check("linear", "bias", bias, np.float32, 1, (n,))
    if m == 0 or n == 0:
        return
    has_bias = bias is not None
    if not has_bias:
        bias = placeholder(np.float32)
    if qt in (Q4_0, Q4_1, Q8_0):
        kernel = _linear_quant_kernel
    elif k % (2 if qt == F32 else 4) == 0 and aligned(wv, 8):
        kernel, wv = _linear_vec_kernel, wv.view(np.uint64)
    else:
        kernel = _linear_float_kernel
    grid = (grid_blocks(n, WARPS), grid_blocks(m, MT))
    kernel[grid, WARPS * 32, stream](x, wv, qt, bias, has_bias, out)
