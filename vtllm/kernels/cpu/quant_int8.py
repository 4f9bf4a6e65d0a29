"""Activations quantized per 32-block to int8 for the fast path, plus numpy references.

Per row of x and block b of 32 values: d_b = max|x| / 127, q = round(x / d_b) (half away from
zero, as Q8_0 rounds) in [-127, 127], S_b = sum(q). Blocks go in pairs (one 512-bit VNNI op
covers two), so each row is padded to an even number of blocks with zeros (d = 0, q = 0), and
each pair carries three 16-lane vectors the kernels read as they are:

    xq [M, P*64] int8      q of blocks 2p, 2p+1
    xd [M, P*16] float32   d_2p x 8, d_2p+1 x 8          (scales the pair's int32 lanes)
    xc [M, P*16] int32     -c*S_2p, 0 x 7, -c*S_2p+1, 0 x 7: the starting int32 lanes. c = 8
                           takes back Q4_0's nibble offset, c = 128 the bias q8_pair adds
    xs [M, G*16] float32   d_b*S_b for each block b (G groups of 16, zero-padded): times
                           Q4_1's block minimums, 16 blocks per FMA

A row's quantization reads only that row, so it does not depend on the batch.
"""

import numpy as np
from numba import njit

from vtllm.kernels import QK, QType
from vtllm.kernels.cpu.quant import dequantize


@njit(inline="always")
def num_pairs(k):
    return (k // QK + 1) // 2


@njit(inline="always")
def num_groups(k):
    return (k // QK + 15) // 16


@njit(inline="always")
def quantize_row(x, m, corr, xq, xd, xc, xs):
    """Row m of x (float32 [M, K], K a multiple of 32) into row m of xq, xd, xc, xs."""
    K = x.shape[1]
    nb = K // QK
    P = xd.shape[1] // 16
    for b in range(2 * P):
        qo = b * QK
        lo = (b // 2) * 16 + (b % 2) * 8
        d = np.float32(0.0)
        s = 0
        if b < nb:
            amax = np.float32(0.0)
            for j in range(QK):
                amax = max(amax, abs(x[m, qo + j]))
            d = amax / np.float32(127.0)
            inv = np.float32(1.0) / d if d > 0 else np.float32(0.0)
            for j in range(QK):
                v = x[m, qo + j] * inv
                r = np.floor(abs(v) + np.float32(0.5))
                q = np.int32(min(r, np.float32(127.0)))
                q = -q if v < 0 else q
                xq[m, qo + j] = q
                s += q
        else:
            for j in range(QK):
                xq[m, qo + j] = 0
        for j in range(8):
            xd[m, lo + j] = d
            xc[m, lo + j] = 0
        xc[m, lo] = -corr * s
        if b < nb:
            xs[m, b] = d * np.float32(s)
    for b in range(nb, xs.shape[1]):
        xs[m, b] = 0


# ---- numpy references (tests, docs) ------------------------------------------------------------


def quantize_activations_ref(x: np.ndarray):
    """(q int8 [M, K], d float32 [M, K/32], S int64 [M, K/32]) as quantize_row computes them."""
    x = np.asarray(x, np.float32)
    m, k = x.shape
    blocks = x.reshape(m, k // QK, QK)
    d = np.abs(blocks).max(axis=2) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = blocks * inv[:, :, None]
    q = np.sign(v) * np.minimum(np.floor(np.abs(v) + np.float32(0.5)), 127)
    q = q.astype(np.int8)
    return q.reshape(m, k), d, q.astype(np.int64).sum(axis=2)


def weight_ints(w: np.ndarray, qtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(integer weights [N, K] as stored: nibbles 0..15 or int8, d [N, K/32], m [N, K/32]) with
    W = d * (q - 8) (Q4_0), d * q + m (Q4_1), d * q (Q8_0)."""
    qtype = QType(qtype)
    hb = 4 if qtype == QType.Q4_1 else 2
    n = w.shape[0]
    bb = {QType.Q4_0: 18, QType.Q4_1: 20, QType.Q8_0: 34}[qtype]
    blocks = np.ascontiguousarray(w).reshape(n, -1, bb)
    d = blocks[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    mins = np.zeros_like(d)
    if qtype == QType.Q4_1:
        mins = blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)
    body = blocks[:, :, hb:]
    if qtype == QType.Q8_0:
        q = body.view(np.int8).astype(np.int64)
    else:
        q = np.concatenate([body & 15, body >> 4], axis=2).astype(np.int64)
    return q.reshape(n, -1), d, mins


def linear_int8_ref(x: np.ndarray, w: np.ndarray, qtype, bias=None) -> np.ndarray:
    """float64 [M, N]: what the int8 kernel computes, with exact integer block dot products and
    each block's float terms rounded to float32 as the kernel rounds them (the remaining
    difference to the kernel is only the order of the float32 sum over blocks)."""
    qtype = QType(qtype)
    q, dx, sx = quantize_activations_ref(x)
    wq, dw, mw = weight_ints(w, qtype)
    m, k = q.shape
    nb = k // QK
    qi = q.astype(np.int64).reshape(m, nb, QK)
    wi = wq.reshape(wq.shape[0], nb, QK)
    dots = np.einsum("mbk,nbk->mnb", qi, wi)  # exact integers
    if qtype == QType.Q4_0:
        dots = dots - 8 * sx[:, None, :]
    scale = (dw[None, :, :] * dx[:, None, :]).astype(np.float32).astype(np.float64)
    y = (dots * scale).sum(axis=2)
    if qtype == QType.Q4_1:
        xs = (dx * sx.astype(np.float32)).astype(np.float32).astype(np.float64)
        y += xs @ mw.astype(np.float64).T
    return y if bias is None else y + np.asarray(bias, np.float64)


def activation_error_bound(x: np.ndarray, w: np.ndarray, qtype) -> np.ndarray:
    """[M, N] bound on |int8 result - exact x @ W.T| from rounding x to int8: each element moves
    by at most d_b / 2, so a block's dot moves by at most d_b / 2 * sum |W| over the block."""
    x = np.asarray(x, np.float32)
    m, k = x.shape
    d = np.abs(x.reshape(m, k // QK, QK)).max(axis=2).astype(np.float64) / 127
    wabs = np.abs(dequantize(w, qtype).astype(np.float64)).reshape(w.shape[0], k // QK, QK)
    return 0.5 * d @ wabs.sum(axis=2).T
