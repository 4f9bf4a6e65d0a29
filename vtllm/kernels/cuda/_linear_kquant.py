"""out = x @ W.T on the GPU for K-quant weights (Q2_K .. Q6_K, super-blocks of 256) and Q5_0 /
Q5_1 (blocks of 32, what llama.cpp's K-quant mixes use where K is no multiple of 256), decoded
inside the kernel. Hot path: keep it lean.

One warp per row n of W, WARPS rows a block, MX rows of x a block (1 for a step of one row,
else 4), fp32 accumulators, one warp reduction at the end. The block walks K in tiles of TILE
columns (four super-blocks, or 32 Q5 blocks):
  - it copies the tile of its rows of x into shared memory, 16-byte unit u of a row at unit
    _swizzle(u), so that the eight lanes one 128-bit shared load serves at a time hit eight
    different bank groups for every lane layout below;
  - each lane decodes 32 weights of its row from one 16-byte chunk of quants, loaded whole
    (the warp's lanes read contiguous chunks), the chunk's scales decoded once:
      Q4_K / Q5_K  lanes 8g + t, super-block g: quant bytes 16t .., pair p = t // 2 (weights
                   64p + 16(t % 2) + j in the low nibbles, 32 on in the high ones);
      Q6_K         lanes 8g + 4h + c: ql bytes 64h + 16c .. and the qh bytes of the same weights;
      Q3_K / Q2_K  lanes 8g + 4h + c: quant bytes 32h + 8c .. (four 2-bit weights a byte);
      Q5_0 / Q5_1  lane b: block b, whole.
Blocks whose size is no multiple of 16 (all but Q4_K's and Q5_K's) sit anywhere in a 16-byte
chunk: bytes16 loads the aligned chunks holding the bytes and shifts them into place.

Bits: a quant becomes a float exactly (or'ed into the mantissa of 2^23, 2^23 subtracted: two
full-rate instructions where a conversion runs at a quarter rate); each weight is decoded as
the CPU decodes it (kernels/cpu/kquant: the scale product rounded to float32 first), except
that d * q - m rounds once (a pinned fma); the accumulators advance by pinned fmas in one fixed
order. So the one-row and the four-row kernels give a row of x the same bits (left to the
compiler, the two contract a * b + c into different fmas). `col0` places the product at
columns col0.. of out, so that q, k and v of different storage types can each write their
part of one qkv buffer. The per-lane units of the routed experts' GEMV and the embedding's
decode live in _kquant_units.

Over 400 lines: the seven storage types' lane decoders sit beside the kernel that walks them,
each read against the layout notes above.
"""

import numpy as np
from numba import cuda, float32

from vtllm.kernels import KQUANT_BYTES, Q5_BYTES, QK_K, QType
from vtllm.kernels.cuda._device import SIMULATOR, as_f32, fma32, imin, warp_sum4
from vtllm.kernels.cuda._host import aligned, grid_blocks, placeholder
from vtllm.kernels.cuda._kquant_units import (  # noqa: F401 (the MoE GEMV's and embedding's)
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    TYPES,
    _block_q5,
    _unit_q6k,
    _unit_q23k,
    _unit_q45k,
    kquant_weight,
)
from vtllm.kernels.cuda._ptx import grid_dependency_sync, item_at
from vtllm.kernels.cuda._ptx_bytes import byte_select, chunk_u32x4, half_to_f32, misalign16
from vtllm.kernels.cuda._ptx_shared import shared_f32x4, store_shared_f32x4

WARPS = 2 if SIMULATOR else 8  # rows of W a block, one warp each: a tile of x serves them all
THREADS = 32 * WARPS
TILE = 1024  # columns of K a pass
UNITS = TILE // 4  # 16-byte units of a row of x's tile
_U = np.uint32
_MAGIC = _U(0x4B000000)  # 2^23: a small integer or'ed into its mantissa gives 2^23 + q exactly
_TWO23 = np.float32(8388608.0)
_LO4, _BIT0, _LO2 = _U(0x0F0F0F0F), _U(0x01010101), _U(0x03030303)
_F0, _F4, _F16, _F32 = (np.float32(v) for v in (0, 4, 16, 32))  # quant offsets


@cuda.jit(device=True)
def _swizzle(u):
    """Where x's 16-byte unit u of a tile row sits in shared memory (a permutation within each
    run of 8 units); found by search over the lane layouts of the module docstring."""
    return u ^ (((u >> 3) ^ ((u >> 4) & 2) ^ ((u >> 5) & 1)) & 7)


@cuda.jit(device=True)
def _byte_f32(word, e, bias):
    """Byte e of word minus bias, as float32, exactly (byte and bias below 2^15): the byte
    placed under the exponent byte of 2^23 by one byte_select."""
    return as_f32(byte_select(word, _MAGIC, _U(0x7440 + e))) - (_TWO23 + bias)


@cuda.jit(device=True)
def _small(v):
    """float32 of a small non-negative integer, exactly."""
    return as_f32(_MAGIC | v) - _TWO23


@cuda.jit(device=True)
def _funnel(lo, hi, sh):
    return _U(((np.uint64(hi) << np.uint64(32)) | np.uint64(lo)) >> sh)


@cuda.jit(device=True)
def bytes16(w, at, need):
    """Bytes at .. at + 15 of w (flat uint8) as four little-endian words, of which the first
    `need` bytes are right (the rest are whatever the chunks held): the aligned chunks that
    hold the first and the last byte needed, shifted into place."""
    s = misalign16(w, at)
    a0, a1, a2, a3 = chunk_u32x4(w, at)
    b0, b1, b2, b3 = chunk_u32x4(w, at + need - 1)
    if s >= 8:
        a0, a1, a2, a3, b0, b1 = a2, a3, b0, b1, b2, b3
    if s & 4:
        a0, a1, a2, a3, b0 = a1, a2, a3, b0, b1
    sh = np.uint64(8 * (s & 3))
    return _funnel(a0, a1, sh), _funnel(a1, a2, sh), _funnel(a2, a3, sh), _funnel(a3, b0, sh)


@cuda.jit(device=True)
def _load(w, at, need, whole):
    """bytes16, or one chunk where the bytes are known to start one (whole)."""
    if whole:
        return chunk_u32x4(w, at)
    return bytes16(w, at, need)


@cuda.jit(device=True)
def _fma4(xs, mx, u, w0, w1, w2, w3, a0, a1, a2, a3):
    """The accumulators of x's mx rows advanced by the weights of x's unit u of the tile."""
    i = 4 * _swizzle(u)
    x0, x1, x2, x3 = shared_f32x4(xs, i)
    a0 = fma32(x3, w3, fma32(x2, w2, fma32(x1, w1, fma32(x0, w0, a0))))
    if mx > 1:
        x0, x1, x2, x3 = shared_f32x4(xs, TILE + i)
        a1 = fma32(x3, w3, fma32(x2, w2, fma32(x1, w1, fma32(x0, w0, a1))))
        x0, x1, x2, x3 = shared_f32x4(xs, 2 * TILE + i)
        a2 = fma32(x3, w3, fma32(x2, w2, fma32(x1, w1, fma32(x0, w0, a2))))
        x0, x1, x2, x3 = shared_f32x4(xs, 3 * TILE + i)
        a3 = fma32(x3, w3, fma32(x2, w2, fma32(x1, w1, fma32(x0, w0, a3))))
    return a0, a1, a2, a3


@cuda.jit(device=True)
def _affine4(xs, mx, u, q, bias, dl, ml, a0, a1, a2, a3):
    """Weights dl * (byte - bias) - ml of the four bytes of q at unit u (fma rounds once)."""
    return _fma4(
        xs, mx, u,
        fma32(dl, _byte_f32(q, 0, bias), -ml), fma32(dl, _byte_f32(q, 1, bias), -ml),
        fma32(dl, _byte_f32(q, 2, bias), -ml), fma32(dl, _byte_f32(q, 3, bias), -ml),
        a0, a1, a2, a3,
    )  # fmt: skip


@cuda.jit(device=True)
def _scaled4(xs, mx, u, q, bias, dl, a0, a1, a2, a3):
    """Weights dl * (byte - bias) of the four bytes of q at unit u."""
    return _fma4(
        xs, mx, u,
        dl * _byte_f32(q, 0, bias), dl * _byte_f32(q, 1, bias),
        dl * _byte_f32(q, 2, bias), dl * _byte_f32(q, 3, bias),
        a0, a1, a2, a3,
    )  # fmt: skip


@cuda.jit(device=True)
def _sbyte(h1, h2, h3, i):
    """Byte i (0..11) of the 12 bytes in words h1, h2, h3."""
    word = h1 if i < 4 else (h2 if i < 8 else h3)
    return (word >> _U(8 * (i & 3))) & _U(0xFF)


@cuda.jit(device=True)
def _scale_min(h1, h2, h3, j):
    """Q4_K / Q5_K: (d scale, dmin scale) of 32-weight run j, 6 bits each, from the 12 scale
    bytes in words h1, h2, h3: runs 0..3 in the low 6 bits of bytes j and j + 4, runs 4..7 in
    the nibbles of byte j + 4 and the top 2 bits of bytes j - 4 and j."""
    sh = _U(8 * (j & 3))
    b1, b2, b3 = (h1 >> sh) & _U(0xFF), (h2 >> sh) & _U(0xFF), (h3 >> sh) & _U(0xFF)
    if j < 4:
        return b1 & _U(63), b2 & _U(63)
    return (b3 & _U(15)) | ((b1 >> _U(6)) << _U(4)), (b3 >> _U(4)) | ((b2 >> _U(6)) << _U(4))


@cuda.jit(device=True)
def _nibbles(xs, mx, u, q, hb, sh, dl0, ml0, dl1, ml1, a0, a1, a2, a3):
    """A word of Q4_K / Q5_K quants: its low nibbles (fifth bits: bit sh of each byte of hb)
    are weights of unit u, its high ones (bit sh + 1) of unit u + 8."""
    lo = (q & _LO4) | (((hb >> sh) & _BIT0) << _U(4))
    hi = ((q >> _U(4)) & _LO4) | (((hb >> (sh + _U(1))) & _BIT0) << _U(4))
    a0, a1, a2, a3 = _affine4(xs, mx, u, lo, _F0, dl0, ml0, a0, a1, a2, a3)
    return _affine4(xs, mx, u + 8, hi, _F0, dl1, ml1, a0, a1, a2, a3)


@cuda.jit(device=True)
def _lane_q45k(w, at, t, qt, whole, xs, mx, ub, a0, a1, a2, a3):
    """Q4_K / Q5_K: lane t's 32 weights of the super-block at byte at (x's units from ub)."""
    h0, h1, h2, h3 = _load(w, at, 16, whole)  # d, dmin, the 12 scale bytes
    d, dmin = half_to_f32(h0 & _U(0xFFFF)), half_to_f32(h0 >> _U(16))
    p = t >> 1
    sc0, m0 = _scale_min(h1, h2, h3, 2 * p)
    sc1, m1 = _scale_min(h1, h2, h3, 2 * p + 1)
    dl0, ml0 = d * _small(sc0), dmin * _small(m0)
    dl1, ml1 = d * _small(sc1), dmin * _small(m1)
    if qt == Q4_K:
        q0, q1, q2, q3 = _load(w, at + 16 + 16 * t, 16, whole)
        e0 = e1 = e2 = e3 = _U(0)
    else:  # fifth bits of byte l of the quant runs: bits 2p, 2p + 1 of qh byte l
        e0, e1, e2, e3 = _load(w, at + 16 + 16 * (t & 1), 16, whole)
        q0, q1, q2, q3 = _load(w, at + 48 + 16 * t, 16, whole)
    sh, u = _U(2 * p), ub + 16 * p + 4 * (t & 1)
    a0, a1, a2, a3 = _nibbles(xs, mx, u, q0, e0, sh, dl0, ml0, dl1, ml1, a0, a1, a2, a3)
    a0, a1, a2, a3 = _nibbles(xs, mx, u + 1, q1, e1, sh, dl0, ml0, dl1, ml1, a0, a1, a2, a3)
    a0, a1, a2, a3 = _nibbles(xs, mx, u + 2, q2, e2, sh, dl0, ml0, dl1, ml1, a0, a1, a2, a3)
    return _nibbles(xs, mx, u + 3, q3, e3, sh, dl0, ml0, dl1, ml1, a0, a1, a2, a3)


@cuda.jit(device=True)
def _six_bits(xs, mx, u, ql, qh, shl, shh, dlo, dhi, a0, a1, a2, a3):
    """A word of Q6_K ql bytes: low nibbles with qh bits shl.. are weights of unit u, high
    nibbles with bits shh.. of unit u + 16."""
    lo = (ql & _LO4) | (((qh >> shl) & _LO2) << _U(4))
    hi = ((ql >> _U(4)) & _LO4) | (((qh >> shh) & _LO2) << _U(4))
    a0, a1, a2, a3 = _scaled4(xs, mx, u, lo, _F32, dlo, a0, a1, a2, a3)
    return _scaled4(xs, mx, u + 16, hi, _F32, dhi, a0, a1, a2, a3)


@cuda.jit(device=True)
def _lane_q6k(w, at, t, xs, mx, ub, a0, a1, a2, a3):
    """Q6_K: lane t = 4h + c: ql bytes 64h + 16c .. (weights 128h + 16c + j and 64 on, the
    runs c // 2 and c // 2 + 2), their qh bytes 32h + 16(c % 2) .., scales 8h + c and + 4."""
    h, c = t >> 2, t & 3
    q0, q1, q2, q3 = bytes16(w, at + 64 * h + 16 * c, 16)
    e0, e1, e2, e3 = bytes16(w, at + 128 + 32 * h + 16 * (c & 1), 16)
    d = half_to_f32(np.int32(w[at + 208]) | (np.int32(w[at + 209]) << 8))
    s = at + 192 + 8 * h + c
    dlo = d * (_small(_U(w[s]) ^ _U(0x80)) - np.float32(128.0))  # int8 scales
    dhi = d * (_small(_U(w[s + 4]) ^ _U(0x80)) - np.float32(128.0))
    shl, shh, u = _U(2 * (c >> 1)), _U(2 * (c >> 1) + 4), ub + 32 * h + 4 * c
    a0, a1, a2, a3 = _six_bits(xs, mx, u, q0, e0, shl, shh, dlo, dhi, a0, a1, a2, a3)
    a0, a1, a2, a3 = _six_bits(xs, mx, u + 1, q1, e1, shl, shh, dlo, dhi, a0, a1, a2, a3)
    a0, a1, a2, a3 = _six_bits(xs, mx, u + 2, q2, e2, shl, shh, dlo, dhi, a0, a1, a2, a3)
    return _six_bits(xs, mx, u + 3, q3, e3, shl, shh, dlo, dhi, a0, a1, a2, a3)


@cuda.jit(device=True)
def _scale_q3(s0, s1, s2, s):
    """Q3_K: scale s (0..15) + 32, 6 bits, from the 12 scale bytes in s0, s1, s2."""
    low = _sbyte(s0, s1, s2, s) & _U(15) if s < 8 else _sbyte(s0, s1, s2, s - 8) >> _U(4)
    high = (_sbyte(s0, s1, s2, 8 + (s & 3)) >> _U(2 * (s >> 2))) & _U(3)
    return low | (high << _U(4))


@cuda.jit(device=True)
def _crumbs(xs, mx, u, q0, q1, m0, m1, s0, s1, s2, d, dmin, qt, j, h, c, a0, a1, a2, a3):
    """Q2_K / Q3_K: the 2-bit quants at bits 2j of the lane's 8 bytes q0, q1 (units u, u + 1),
    with Q3_K's hmask bits 4h + j of m0, m1."""
    sj, sm = _U(2 * j), _U(4 * h + j)
    v0, v1 = (q0 >> sj) & _LO2, (q1 >> sj) & _LO2
    if qt == Q2_K:
        sc = _sbyte(s0, s1, s2, 2 * j + (c >> 1))
        dl, ml = d * _small(sc & _U(15)), dmin * _small(sc >> _U(4))
        a0, a1, a2, a3 = _affine4(xs, mx, u, v0, _F0, dl, ml, a0, a1, a2, a3)
        return _affine4(xs, mx, u + 1, v1, _F0, dl, ml, a0, a1, a2, a3)
    dl = d * (_small(_scale_q3(s0, s1, s2, 8 * h + 2 * j + (c >> 1))) - _F32)
    v0 |= ((m0 >> sm) & _BIT0) << _U(2)
    v1 |= ((m1 >> sm) & _BIT0) << _U(2)
    a0, a1, a2, a3 = _scaled4(xs, mx, u, v0, _F4, dl, a0, a1, a2, a3)
    return _scaled4(xs, mx, u + 1, v1, _F4, dl, a0, a1, a2, a3)


@cuda.jit(device=True)
def _lane_q23k(w, at, t, qt, xs, mx, ub, a0, a1, a2, a3):
    """Q2_K / Q3_K: lane t = 4h + c: quant bytes 32h + 8c .. (weights 128h + 32j + 8c + ..
    at bits 2j), scales 8h + 2j + c // 2."""
    h, c = t >> 2, t & 3
    if qt == Q2_K:
        q0, q1, _, _ = bytes16(w, at + 16 + 32 * h + 8 * c, 8)
        s0, s1, _, _ = bytes16(w, at + 8 * h, 8)  # scale bytes 8h ..: d scale | dmin scale << 4
        dd, _, _, _ = bytes16(w, at + 80, 4)
        d, dmin = half_to_f32(dd & _U(0xFFFF)), half_to_f32(dd >> _U(16))
        m0 = m1 = s2 = _U(0)
    else:
        q0, q1, _, _ = bytes16(w, at + 32 + 32 * h + 8 * c, 8)
        m0, m1, _, _ = bytes16(w, at + 8 * c, 8)  # hmask: a clear bit 4h + j subtracts 4
        s0, s1, s2, dd = bytes16(w, at + 96, 14)
        d, dmin = half_to_f32(dd & _U(0xFFFF)), np.float32(0.0)
    u = ub + 32 * h + 2 * c  # run j's weights at units u + 8j, u + 8j + 1
    a0, a1, a2, a3 = _crumbs(
        xs, mx, u, q0, q1, m0, m1, s0, s1, s2, d, dmin, qt, 0, h, c, a0, a1, a2, a3
    )
    a0, a1, a2, a3 = _crumbs(
        xs, mx, u + 8, q0, q1, m0, m1, s0, s1, s2, d, dmin, qt, 1, h, c, a0, a1, a2, a3
    )
    a0, a1, a2, a3 = _crumbs(
        xs, mx, u + 16, q0, q1, m0, m1, s0, s1, s2, d, dmin, qt, 2, h, c, a0, a1, a2, a3
    )
    return _crumbs(xs, mx, u + 24, q0, q1, m0, m1, s0, s1, s2, d, dmin, qt, 3, h, c,
                   a0, a1, a2, a3)  # fmt: skip


@cuda.jit(device=True)
def _spread4(b):
    """Bits 0..3 of b as bit 4 of bytes 0..3."""
    return (((b & _U(15)) * _U(0x00204081)) & _BIT0) << _U(4)


@cuda.jit(device=True)
def _q5_word(xs, mx, ub, q, qh, i, d, mn, qt, a0, a1, a2, a3):
    """Word i of a Q5 block's nibbles: weights 4i .. (unit ub + i) and 16 + 4i .. (ub + 4 + i)."""
    lo = (q & _LO4) | _spread4(qh >> _U(4 * i))
    hi = ((q >> _U(4)) & _LO4) | _spread4(qh >> _U(16 + 4 * i))
    if qt == Q5_0:  # d * (q - 16)
        a0, a1, a2, a3 = _scaled4(xs, mx, ub + i, lo, _F16, d, a0, a1, a2, a3)
        return _scaled4(xs, mx, ub + 4 + i, hi, _F16, d, a0, a1, a2, a3)
    a0, a1, a2, a3 = _affine4(xs, mx, ub + i, lo, _F0, d, -mn, a0, a1, a2, a3)  # d * q + m
    return _affine4(xs, mx, ub + 4 + i, hi, _F0, d, -mn, a0, a1, a2, a3)


@cuda.jit(device=True)
def _lane_q5(w, at, qt, xs, mx, ub, a0, a1, a2, a3):
    """Q5_0 / Q5_1: the block at byte at, whole: nibbles of byte j are weights j and 16 + j,
    their fifth bits bits j and 16 + j of qh."""
    if qt == Q5_0:
        h0, h1, _, _ = bytes16(w, at, 6)
        qh, mn = (h0 >> _U(16)) | (h1 << _U(16)), np.float32(0.0)
        q0, q1, q2, q3 = bytes16(w, at + 6, 16)
    else:
        h0, qh, _, _ = bytes16(w, at, 8)
        mn = half_to_f32(h0 >> _U(16))
        q0, q1, q2, q3 = bytes16(w, at + 8, 16)
    d = half_to_f32(h0 & _U(0xFFFF))
    a0, a1, a2, a3 = _q5_word(xs, mx, ub, q0, qh, 0, d, mn, qt, a0, a1, a2, a3)
    a0, a1, a2, a3 = _q5_word(xs, mx, ub, q1, qh, 1, d, mn, qt, a0, a1, a2, a3)
    a0, a1, a2, a3 = _q5_word(xs, mx, ub, q2, qh, 2, d, mn, qt, a0, a1, a2, a3)
    return _q5_word(xs, mx, ub, q3, qh, 3, d, mn, qt, a0, a1, a2, a3)


@cuda.jit(device=True)
def _stage(x, xs, mx, m0, c0, tid):
    """The tile of x's rows m0 .. m0 + mx - 1 (clamped) from column c0 into shared memory."""
    M, K = x.shape
    for m in range(mx):
        row = np.int64(imin(m0 + m, M - 1)) * K
        for v in range(UNITS // THREADS):
            u = tid + v * THREADS
            col = c0 + 4 * u
            if col < K:
                at = row + col
                store_shared_f32x4(
                    xs, m * TILE + 4 * _swizzle(u),
                    item_at(x, at), item_at(x, at + 1), item_at(x, at + 2), item_at(x, at + 3),
                )  # fmt: skip


def _make_kernel(qt: int, mx: int, whole: bool):
    """The GEMV for W of type qt, mx rows of x a block; whole: every 16-byte chunk of quants
    starts on a 16-byte boundary (Q4_K / Q5_K rows on one)."""
    superblocks = qt not in (Q5_0, Q5_1)
    bb = KQUANT_BYTES[QType(qt)] if superblocks else Q5_BYTES[QType(qt)]
    tile_floats = mx * TILE  # (numba needs the shared array's size as one constant)

    @cuda.jit(cache=True)
    def kernel(x, w, row_bytes, bias, has_bias, col0, n_out, out):
        grid_dependency_sync()
        xs = cuda.shared.array(tile_floats, float32)
        M, K = x.shape
        tid = cuda.threadIdx.x
        lane = tid % 32
        n = cuda.blockIdx.x * WARPS + tid // 32
        row_at = np.int64(imin(n, n_out - 1)) * row_bytes
        m0 = cuda.blockIdx.y * mx
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for c0 in range(0, K, TILE):  # block-uniform: every warp takes part in each barrier
            cuda.syncthreads()  # the last tile's readers are done
            _stage(x, xs, mx, m0, c0, tid)
            cuda.syncthreads()
            if superblocks:
                b = c0 // QK_K + lane // 8
                if b < K // QK_K:
                    at, t, ub = row_at + b * bb, lane % 8, 64 * (lane // 8)
                    if qt == Q4_K or qt == Q5_K:
                        a0, a1, a2, a3 = _lane_q45k(w, at, t, qt, whole, xs, mx, ub, a0, a1, a2, a3)
                    elif qt == Q6_K:
                        a0, a1, a2, a3 = _lane_q6k(w, at, t, xs, mx, ub, a0, a1, a2, a3)
                    else:
                        a0, a1, a2, a3 = _lane_q23k(w, at, t, qt, xs, mx, ub, a0, a1, a2, a3)
            else:
                blk = c0 // 32 + lane
                if blk < K // 32:
                    at = row_at + blk * bb
                    a0, a1, a2, a3 = _lane_q5(w, at, qt, xs, mx, 8 * lane, a0, a1, a2, a3)
        a0, a1, a2, a3 = warp_sum4(a0, a1, a2, a3)
        if lane == 0 and n < n_out:
            c = col0 + n
            bv = bias[c] if has_bias else np.float32(0.0)
            out[m0, c] = a0 + bv
            if mx > 1:
                if m0 + 1 < M:
                    out[m0 + 1, c] = a1 + bv
                if m0 + 2 < M:
                    out[m0 + 2, c] = a2 + bv
                if m0 + 3 < M:
                    out[m0 + 3, c] = a3 + bv

    return kernel


_kernels: dict = {}  # (qt, mx, whole) -> kernel, made on first use


def kernel_for(qt: int, m: int, w) -> tuple:
    """(kernel, rows of x a block) for a step of m rows through W (uint8 rows) of type qt."""
    mx = 1 if m == 1 else 4
    whole = qt in (Q4_K, Q5_K) and aligned(w, 16)
    key = (qt, mx, whole)
    if key not in _kernels:
        _kernels[key] = _make_kernel(*key)
    return _kernels[key], mx


def linear_kquant(x, w, qt, out, bias, col0, stream) -> None:
    """The GEMV over arguments _linear.linear has checked: w the uint8 rows, out
    [M, >= col0 + N]."""
    (n, row_bytes), m = w.shape, x.shape[0]
    has_bias = bias is not None
    if not has_bias:
        bias = placeholder(np.float32)
    kernel, mx = kernel_for(qt, m, w)
    grid = (grid_blocks(n, WARPS), grid_blocks(m, mx))
    flat = w.reshape(n * row_bytes)
    kernel[grid, THREADS, stream](x, flat, row_bytes, bias, has_bias, col0, n, out)
