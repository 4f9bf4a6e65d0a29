"""Per-lane decode units of K-quant (Q2_K .. Q6_K) and Q5_0 / Q5_1 weights, rows read as uint16
words: the routed experts' GEMV (_moe_gemv) walks a row with them, and kquant_weight decodes one
element (the embedding's lookup). The dense GEMV has its own layout (_linear_kquant).

A warp walks a row 256 weights at a time (one super-block, or eight Q5 blocks) and each lane
decodes 8 of them, chosen so that the lanes' quant bytes are consecutive words:
  Q4_K / Q5_K  lane 8j + t: bytes 4t..4t+3 of the 32-byte quant run j (weights 64j + 4t + i
               in the low nibbles, 64j + 32 + 4t + i in the high ones);
  Q6_K, Q3_K, Q2_K  lane 16h + u: weights l = 2u, 2u + 1 of each of the four 32-weight runs
               of half h that share those quant bytes;
  Q5_0 / Q5_1  lane 4b + s: bytes 4s..4s+3 of block b's nibbles (weights 4s + i, 16 + 4s + i).
Each weight is decoded as the CPU decodes it (kernels/cpu/kquant: the scale product rounded
to float32 first), except that d * q - m rounds once (a pinned fma), then multiplied into the
accumulators with pinned fmas too: a one-row and a four-row loop round alike.
"""

import numpy as np
from numba import cuda

from vtllm.kernels import KQUANT_BYTES, Q5_BYTES, QK_K, QType
from vtllm.kernels.cuda._device import byte_at, f16_to_f32, fma32

Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = (
    int(q) for q in (QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K)
)
Q5_0, Q5_1 = int(QType.Q5_0), int(QType.Q5_1)
BB_Q2_K, BB_Q3_K, BB_Q4_K, BB_Q5_K, BB_Q6_K = (
    KQUANT_BYTES[QType(q)] for q in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
)
BB_Q5_0, BB_Q5_1 = Q5_BYTES[QType.Q5_0], Q5_BYTES[QType.Q5_1]
TYPES = frozenset((Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q5_0, Q5_1))


@cuda.jit(device=True)
def _u32(w, r, off):
    """Four bytes at an even byte offset, little-endian."""
    return np.int64(w[r, off // 2]) | (np.int64(w[r, off // 2 + 1]) << 16)


@cuda.jit(device=True)
def _scale_min_k4(w, r, o, s):
    """Q4_K / Q5_K: the 6-bit scale and minimum of 32-weight run s (the 12 bytes at o + 4)."""
    if s < 4:
        return byte_at(w, r, o + 4 + s) & 63, byte_at(w, r, o + 8 + s) & 63
    sc = (byte_at(w, r, o + 8 + s) & 15) | ((byte_at(w, r, o + s) >> 6) << 4)
    mn = (byte_at(w, r, o + 8 + s) >> 4) | ((byte_at(w, r, o + 4 + s) >> 6) << 4)
    return sc, mn


@cuda.jit(device=True)
def _scale_q3(w, r, o, s):
    """Q3_K: the signed 6-bit scale of 16-weight chunk s (the 12 bytes at o + 96)."""
    if s < 8:
        low = byte_at(w, r, o + 96 + s) & 15
    else:
        low = byte_at(w, r, o + 88 + s) >> 4
    high = (byte_at(w, r, o + 104 + s % 4) >> (2 * (s // 4))) & 3
    return (low | (high << 4)) - 32


@cuda.jit(device=True)
def _acc2(x, x0, x1, x2, x3, one, k, w0, w1, a0, a1, a2, a3):
    """Accumulators advanced by weights w0, w1 at columns k, k + 1: two pinned fused
    multiply-adds per row, so the one-row path rounds as the four-row path does (left to the
    compiler, the two paths contract a * b + c into different fmas)."""
    a0 = fma32(x[x0, k + 1], w1, fma32(x[x0, k], w0, a0))
    if not one:
        a1 = fma32(x[x1, k + 1], w1, fma32(x[x1, k], w0, a1))
        a2 = fma32(x[x2, k + 1], w1, fma32(x[x2, k], w0, a2))
        a3 = fma32(x[x3, k + 1], w1, fma32(x[x3, k], w0, a3))
    return a0, a1, a2, a3


@cuda.jit(device=True)
def _nibbles(x, x0, x1, x2, x3, one, word, hbits, k_lo, k_hi, dl, ml, dh, mh, a0, a1, a2, a3):
    """Four bytes of nibbles: the low ones are weights k_lo.. (dl * q - ml), the high ones
    k_hi.. (dh * q - mh); hbits adds a fifth bit to each (Q5_K: byte i's bit 0 to the low
    nibble, bit 1 to the high one), 0 for Q4_K."""
    for p in range(2):
        b0 = (word >> (16 * p)) & 0xFF
        b1 = (word >> (16 * p + 8)) & 0xFF
        h0 = (hbits >> (16 * p)) & 0xFF
        h1 = (hbits >> (16 * p + 8)) & 0xFF
        lo0 = np.float32((b0 & 15) | ((h0 & 1) << 4))
        lo1 = np.float32((b1 & 15) | ((h1 & 1) << 4))
        hi0 = np.float32((b0 >> 4) | ((h0 & 2) << 3))
        hi1 = np.float32((b1 >> 4) | ((h1 & 2) << 3))
        a0, a1, a2, a3 = _acc2(
            x,
            x0,
            x1,
            x2,
            x3,
            one,
            k_lo + 2 * p,
            fma32(dl, lo0, -ml),
            fma32(dl, lo1, -ml),
            a0,
            a1,
            a2,
            a3,
        )
        a0, a1, a2, a3 = _acc2(
            x,
            x0,
            x1,
            x2,
            x3,
            one,
            k_hi + 2 * p,
            fma32(dh, hi0, -mh),
            fma32(dh, hi1, -mh),
            a0,
            a1,
            a2,
            a3,
        )
    return a0, a1, a2, a3


@cuda.jit(device=True)
def _unit_q45k(x, x0, x1, x2, x3, one, w, r, qt, b, lane, a0, a1, a2, a3):
    """Q4_K / Q5_K super-block b: this lane's 8 weights."""
    j, t = lane // 8, lane % 8
    o = b * (BB_Q4_K if qt == Q4_K else BB_Q5_K)
    d, dmin = f16_to_f32(w[r, o // 2]), f16_to_f32(w[r, o // 2 + 1])
    sc0, m0 = _scale_min_k4(w, r, o, 2 * j)
    sc1, m1 = _scale_min_k4(w, r, o, 2 * j + 1)
    if qt == Q4_K:
        word, hbits = _u32(w, r, o + 16 + 32 * j + 4 * t), np.int64(0)
    else:  # the fifth bits of weight l of run pair j sit at bits 2j, 2j + 1 of byte l
        word = _u32(w, r, o + 48 + 32 * j + 4 * t)
        hbits = (_u32(w, r, o + 16 + 4 * t) >> (2 * j)) & 0x03030303
    k = b * QK_K + 64 * j + 4 * t
    return _nibbles(
        x, x0, x1, x2, x3, one, word, hbits, k, k + 32,
        d * np.float32(sc0), dmin * np.float32(m0), d * np.float32(sc1), dmin * np.float32(m1),
        a0, a1, a2, a3,
    )  # fmt: skip


@cuda.jit(device=True)
def _unit_q6k(x, x0, x1, x2, x3, one, w, r, b, lane, a0, a1, a2, a3):
    """Q6_K super-block b: weights 128h + l + 32i (l = 2u, 2u + 1; i < 4)."""
    h, u = lane // 16, lane % 16
    o = b * BB_Q6_K
    d = f16_to_f32(w[r, (o + 208) // 2])
    ql0 = np.int64(w[r, (o + 64 * h + 2 * u) // 2])  # weights l, l + 64 (nibbles)
    ql1 = np.int64(w[r, (o + 64 * h + 32 + 2 * u) // 2])  # weights l + 32, l + 96
    qh = np.int64(w[r, (o + 128 + 32 * h + 2 * u) // 2])  # 2 high bits of each of the four
    k = b * QK_K + 128 * h + 2 * u
    for i in range(4):
        src = ql0 if i % 2 == 0 else ql1
        shift = 4 * (i // 2)
        s = byte_at(w, r, o + 192 + 8 * h + u // 8 + 2 * i)
        dl = d * np.float32(s - 256 if s > 127 else s)
        q0 = ((src >> shift) & 15) | (((qh >> (2 * i)) & 3) << 4)
        q1 = ((src >> (8 + shift)) & 15) | (((qh >> (8 + 2 * i)) & 3) << 4)
        a0, a1, a2, a3 = _acc2(
            x, x0, x1, x2, x3, one, k + 32 * i,
            dl * np.float32(q0 - 32), dl * np.float32(q1 - 32), a0, a1, a2, a3,
        )  # fmt: skip
    return a0, a1, a2, a3


@cuda.jit(device=True)
def _unit_q23k(x, x0, x1, x2, x3, one, w, r, qt, b, lane, a0, a1, a2, a3):
    """Q2_K / Q3_K super-block b: weights 128h + 32j + l (l = 2u, 2u + 1; j < 4), the 2-bit
    quants of byte l of half h at bits 2j."""
    h, u = lane // 16, lane % 16
    if qt == Q2_K:
        o = b * BB_Q2_K
        d, dmin = f16_to_f32(w[r, (o + 80) // 2]), f16_to_f32(w[r, (o + 82) // 2])
        qs = np.int64(w[r, (o + 16 + 32 * h + 2 * u) // 2])
        hm = np.int64(0)
    else:
        o = b * BB_Q3_K
        d, dmin = f16_to_f32(w[r, (o + 108) // 2]), np.float32(0.0)
        qs = np.int64(w[r, (o + 32 + 32 * h + 2 * u) // 2])
        hm = np.int64(w[r, (o + 2 * u) // 2])  # Q3_K: a clear bit subtracts 4
    k = b * QK_K + 128 * h + 2 * u
    for j in range(4):
        s = 8 * h + 2 * j + u // 8
        q0 = (qs >> (2 * j)) & 3
        q1 = (qs >> (8 + 2 * j)) & 3
        if qt == Q2_K:
            sc = byte_at(w, r, o + s)
            dl = d * np.float32(sc & 15)
            ml = dmin * np.float32(sc >> 4)
        else:
            dl = d * np.float32(_scale_q3(w, r, o, s))
            ml = np.float32(0.0)
            bit = 4 * h + j
            q0 -= 0 if (hm >> bit) & 1 else 4
            q1 -= 0 if (hm >> (8 + bit)) & 1 else 4
        a0, a1, a2, a3 = _acc2(
            x, x0, x1, x2, x3, one, k + 32 * j,
            fma32(dl, np.float32(q0), -ml), fma32(dl, np.float32(q1), -ml), a0, a1, a2, a3,
        )  # fmt: skip
    return a0, a1, a2, a3


@cuda.jit(device=True)
def _q5(q, d, mn, qt):
    """A Q5 quant (0..31) decoded as the CPU decodes it: Q5_0 d * (q - 16), Q5_1 d * q + m."""
    if qt == Q5_0:
        return d * (np.float32(q) - np.float32(16.0))
    return fma32(d, np.float32(q), mn)


@cuda.jit(device=True)
def _block_q5(x, x0, x1, x2, x3, one, w, r, qt, blk, sub, a0, a1, a2, a3):
    """Q5_0 / Q5_1 block blk (32 weights): this lane's weights 4 sub + i and 16 + 4 sub + i
    (nibbles of bytes 4 sub + i; their fifth bits are bits 4 sub + i and 16 + 4 sub + i of
    the block's 32-bit qh)."""
    if qt == Q5_0:
        o = blk * BB_Q5_0
        d, mn = f16_to_f32(w[r, o // 2]), np.float32(0.0)
        qh, body = _u32(w, r, o + 2), o + 6
    else:
        o = blk * BB_Q5_1
        d, mn = f16_to_f32(w[r, o // 2]), f16_to_f32(w[r, o // 2 + 1])
        qh, body = _u32(w, r, o + 4), o + 8
    word = _u32(w, r, body + 4 * sub)
    k = blk * 32 + 4 * sub
    for p in range(2):
        b0 = (word >> (16 * p)) & 0xFF
        b1 = (word >> (16 * p + 8)) & 0xFF
        i = 4 * sub + 2 * p
        lo0 = (b0 & 15) | (((qh >> i) & 1) << 4)
        lo1 = (b1 & 15) | (((qh >> (i + 1)) & 1) << 4)
        hi0 = (b0 >> 4) | (((qh >> (i + 16)) & 1) << 4)
        hi1 = (b1 >> 4) | (((qh >> (i + 17)) & 1) << 4)
        a0, a1, a2, a3 = _acc2(
            x, x0, x1, x2, x3, one, k + 2 * p,
            _q5(lo0, d, mn, qt), _q5(lo1, d, mn, qt), a0, a1, a2, a3,
        )  # fmt: skip
        a0, a1, a2, a3 = _acc2(
            x, x0, x1, x2, x3, one, k + 16 + 2 * p,
            _q5(hi0, d, mn, qt), _q5(hi1, d, mn, qt), a0, a1, a2, a3,
        )  # fmt: skip
    return a0, a1, a2, a3


@cuda.jit(device=True)
def kquant_weight(w, r, k, qt):
    """Element k of row r (rows as uint16 words) of a K-quant or Q5_0 / Q5_1 weight, decoded
    as the GEMV decodes it (the embedding's lookup)."""
    if qt == Q5_0 or qt == Q5_1:
        blk, j = k // 32, k % 32
        o = blk * (BB_Q5_0 if qt == Q5_0 else BB_Q5_1)
        qh = _u32(w, r, o + 2 if qt == Q5_0 else o + 4)
        body = o + (6 if qt == Q5_0 else 8)
        byte = byte_at(w, r, body + j % 16)
        q = ((byte & 15) if j < 16 else (byte >> 4)) | (((qh >> j) & 1) << 4)
        mn = f16_to_f32(w[r, o // 2 + 1]) if qt == Q5_1 else np.float32(0.0)
        return _q5(q, f16_to_f32(w[r, o // 2]), mn, qt)
    b, e = k // QK_K, k % QK_K
    if qt == Q4_K or qt == Q5_K:
        o = b * (BB_Q4_K if qt == Q4_K else BB_Q5_K)
        j, hi, l = e // 64, (e % 64) // 32, e % 32
        sc, mn = _scale_min_k4(w, r, o, 2 * j + hi)
        base = o + 16 if qt == Q4_K else o + 48
        q = (byte_at(w, r, base + 32 * j + l) >> (4 * hi)) & 15
        if qt == Q5_K:
            q |= ((byte_at(w, r, o + 16 + l) >> (2 * j + hi)) & 1) << 4
        d, dmin = f16_to_f32(w[r, o // 2]), f16_to_f32(w[r, o // 2 + 1])
        return fma32(d * np.float32(sc), np.float32(q), -(dmin * np.float32(mn)))
    h, i, l = e // 128, (e % 128) // 32, e % 32
    if qt == Q6_K:
        o = b * BB_Q6_K
        ql = byte_at(w, r, o + 64 * h + 32 * (i % 2) + l)
        q = ((ql >> (4 * (i // 2))) & 15) | (
            ((byte_at(w, r, o + 128 + 32 * h + l) >> (2 * i)) & 3) << 4
        )
        s = byte_at(w, r, o + 192 + 8 * h + l // 16 + 2 * i)
        dl = f16_to_f32(w[r, (o + 208) // 2]) * np.float32(s - 256 if s > 127 else s)
        return dl * np.float32(q - 32)
    s = 8 * h + 2 * i + l // 16
    if qt == Q2_K:
        o = b * BB_Q2_K
        q = (byte_at(w, r, o + 16 + 32 * h + l) >> (2 * i)) & 3
        sc = byte_at(w, r, o + s)
        dl = f16_to_f32(w[r, (o + 80) // 2]) * np.float32(sc & 15)
        return fma32(dl, np.float32(q), -(f16_to_f32(w[r, (o + 82) // 2]) * np.float32(sc >> 4)))
    o = b * BB_Q3_K
    q = (byte_at(w, r, o + 32 + 32 * h + l) >> (2 * i)) & 3
    q -= 0 if (byte_at(w, r, o + l) >> (4 * h + i)) & 1 else 4
    return (f16_to_f32(w[r, (o + 108) // 2]) * np.float32(_scale_q3(w, r, o, s))) * np.float32(q)
