"""K-quant weights (GGML super-blocks of 256), and Q5_0 / Q5_1 (blocks of 32), decoded to
float32 lanes inside CPU kernels.

Every super-block splits into 16 chunks of 16 consecutive weights, and each chunk has one
scale (and for Q2_K / Q4_K / Q5_K one minimum): `kq_chunk` decodes chunk c of a super-block
as 16 float32 lanes, computed as ggml and gguf-py compute them:

  Q2_K  (d * (sc & 15)) * q - (dmin * (sc >> 4))    q in 0..3, a scale byte per chunk
  Q3_K  (d * (sc - 32)) * q                         q in -4..3, 6-bit scales
  Q4_K  (d * sc) * q - (dmin * m)                   q in 0..15, 6-bit sc / m per 32 weights
  Q5_K  as Q4_K                                     q in 0..31
  Q6_K  (d * sc) * q                                q in -32..31, an int8 scale per chunk
  Q8_K  d * q                                       d float32, q int8
  Q5_0  d * (q - 16), Q5_1 d * q + m                q in 0..31, 2 chunks per 32-weight block

(parenthesised products are rounded to float32 first). The linear kernels, their GEMM tiles
and the embedding all decode with this one function, so a weight is the same float in each.
Only inline functions here: nothing compiles until a kernel that uses them does.
"""

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from vtllm.kernels import KQUANT_BYTES, Q5_BYTES, QType
from vtllm.kernels.cpu._simd import (
    _VF,
    _VI32,
    LANES,
    V16,
    _check_array,
    _load_vec,
    _ptr,
    ld_f16,
    ld_f32,
    vadd,
    vload_i8,
    vmul,
    vsplat,
    vstore,
    vsub,
)

Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = (
    int(q) for q in (QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.Q8_K)
)
Q5_0, Q5_1 = int(QType.Q5_0), int(QType.Q5_1)
BB_Q5_0, BB_Q5_1 = Q5_BYTES[QType.Q5_0], Q5_BYTES[QType.Q5_1]
BB_Q2_K, BB_Q3_K, BB_Q4_K, BB_Q5_K, BB_Q6_K, BB_Q8_K = (
    KQUANT_BYTES[QType(q)] for q in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K)
)


def _intp(context, builder, sig, args, i):
    return context.cast(builder, args[i], sig.args[i], types.intp)


def _field(context, builder, sig, args, first):
    """16 bytes at offset args[first], shifted right by args[first + 1], masked by args[first
    + 2], as <16 x i32>."""
    off, shift, mask = (_intp(context, builder, sig, args, first + i) for i in range(3))
    raw = _load_vec(
        builder, _ptr(context, builder, sig.args[0], args[0], off), ir.VectorType(ir.IntType(8), 16)
    )
    wide = builder.zext(raw, _VI32)

    def splat(v):
        v32 = builder.trunc(v, ir.IntType(32))
        vec = builder.insert_element(ir.Constant(_VI32, ir.Undefined), v32, ir.Constant(_I32, 0))
        return builder.shuffle_vector(vec, vec, ir.Constant(_VI32, [0] * LANES))

    return builder.and_(builder.lshr(wide, splat(shift)), splat(mask)), splat


_I32 = ir.IntType(32)


@intrinsic
def vbits(typingctx, w, off, shift, mask):
    """Float lanes of (w[off + i] >> shift) & mask for i < 16 (w uint8, flat offsets)."""
    if not _check_array(w, (types.uint8,)):
        return None

    def codegen(context, builder, sig, args):
        v, _ = _field(context, builder, sig, args, 1)
        return builder.sitofp(v, _VF)

    return V16(w, off, shift, mask), codegen


@intrinsic
def vbits2(typingctx, w, off, shift, mask, off_h, shift_h, mask_h, up):
    """Float lanes of ((w[off + i] >> shift) & mask) | (((w[off_h + i] >> shift_h) & mask_h)
    << up): a low field and its high bits stored apart (Q3_K, Q5_K, Q6_K)."""
    if not _check_array(w, (types.uint8,)):
        return None

    def codegen(context, builder, sig, args):
        lo, splat = _field(context, builder, sig, args, 1)
        hi, _ = _field(context, builder, sig, args, 4)
        hi = builder.shl(hi, splat(_intp(context, builder, sig, args, 7)))
        return builder.sitofp(builder.or_(lo, hi), _VF)

    return V16(w, off, shift, mask, off_h, shift_h, mask_h, up), codegen


@intrinsic
def ld_u8(typingctx, w, off):
    """w[off] of a uint8 array at a flat offset, as int64."""
    if not _check_array(w, (types.uint8,)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], args[0], _intp(context, builder, sig, args, 1))
        return builder.zext(builder.load(ptr), ir.IntType(64))

    return types.int64(w, off), codegen


@intrinsic
def vbit16(typingctx, w, off):
    """Float lanes of bit i of the little-endian 16-bit word at byte offset off (lane i < 16):
    Q5_0 / Q5_1 keep their fifth bits that way."""
    if not _check_array(w, (types.uint8,)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], args[0], _intp(context, builder, sig, args, 1))
        word = builder.zext(_load_vec(builder, ptr, ir.IntType(16)), _I32)
        vec = builder.insert_element(ir.Constant(_VI32, ir.Undefined), word, ir.Constant(_I32, 0))
        vec = builder.shuffle_vector(vec, vec, ir.Constant(_VI32, [0] * LANES))
        bits = builder.lshr(vec, ir.Constant(_VI32, list(range(LANES))))
        return builder.sitofp(builder.and_(bits, ir.Constant(_VI32, [1] * LANES)), _VF)

    return V16(w, off), codegen


@njit(inline="always")
def kq_block_bytes(qt):
    if qt == Q5_0:
        return BB_Q5_0
    if qt == Q5_1:
        return BB_Q5_1
    if qt == Q4_K:
        return BB_Q4_K
    if qt == Q6_K:
        return BB_Q6_K
    if qt == Q5_K:
        return BB_Q5_K
    if qt == Q2_K:
        return BB_Q2_K
    if qt == Q3_K:
        return BB_Q3_K
    return BB_Q8_K


@njit(inline="always")
def scale_min_k4(w, sb, j):
    """Q4_K / Q5_K: 6-bit scale and minimum of 32-weight sub-block j (ggml's
    get_scale_min_k4); the 12 packed bytes start at byte 4 of the super-block."""
    s = sb + 4
    if j < 4:
        return ld_u8(w, s + j) & 63, ld_u8(w, s + j + 4) & 63
    sc = (ld_u8(w, s + j + 4) & 15) | ((ld_u8(w, s + j - 4) >> 6) << 4)
    m = (ld_u8(w, s + j + 4) >> 4) | ((ld_u8(w, s + j) >> 6) << 4)
    return sc, m


@njit(inline="always")
def q3_scale(w, sb, c):
    """Q3_K: 6-bit scale of chunk c, minus 32 (low nibbles in bytes 96..103, high 2-bit pairs
    in bytes 104..107)."""
    s = sb + 96
    lo = (ld_u8(w, s + (c & 7)) >> (4 * (c >> 3))) & 15
    hi = (ld_u8(w, s + 8 + (c & 3)) >> (2 * (c >> 2))) & 3
    return (lo | (hi << 4)) - 32


# ---- one decoder per type: (w, byte offset of the super-block, chunk) -> 16 float32 lanes.
# Kernels call the type's own decoder (a branch per type inside every inlined call site would
# multiply the code numba and LLVM compile by the number of types).


@njit(inline="always")
def _chunk_q4k_q5k(w, sb, c, five):
    j, t = c >> 1, c & 1  # 32-weight sub-block, half of it
    sc, m = scale_min_k4(w, sb, j)
    d1 = ld_f16(w, sb) * np.float32(sc)
    m1 = ld_f16(w, sb + 2) * np.float32(m)
    if five:
        lo = sb + 48 + (j >> 1) * 32 + t * 16
        q = vbits2(w, lo, (j & 1) * 4, 15, sb + 16 + t * 16, j, 1, 4)
    else:
        q = vbits(w, sb + 16 + (j >> 1) * 32 + t * 16, (j & 1) * 4, 15)
    return vsub(vmul(vsplat(d1), q), vsplat(m1))


@njit(inline="always")
def chunk_q4k(w, sb, c):
    return _chunk_q4k_q5k(w, sb, c, False)


@njit(inline="always")
def chunk_q5k(w, sb, c):
    return _chunk_q4k_q5k(w, sb, c, True)


@njit(inline="always")
def chunk_q6k(w, sb, c):
    h, r, t = c >> 3, (c >> 1) & 3, c & 1  # 128-weight half, 32-weight part of it, 16 of those
    sc = ld_u8(w, sb + 192 + c)
    d1 = ld_f16(w, sb + 208) * np.float32(sc - 256 if sc > 127 else sc)
    lo = sb + h * 64 + (r & 1) * 32 + t * 16
    q = vbits2(w, lo, (r >> 1) * 4, 15, sb + 128 + h * 32 + t * 16, 2 * r, 3, 4)
    return vmul(vsplat(d1), vsub(q, vsplat(np.float32(32.0))))


@njit(inline="always")
def chunk_q2k(w, sb, c):
    h, r, t = c >> 3, (c >> 1) & 3, c & 1
    sc = ld_u8(w, sb + c)
    d1 = ld_f16(w, sb + 80) * np.float32(sc & 15)
    m1 = ld_f16(w, sb + 82) * np.float32(sc >> 4)
    return vsub(vmul(vsplat(d1), vbits(w, sb + 16 + h * 32 + t * 16, 2 * r, 3)), vsplat(m1))


@njit(inline="always")
def chunk_q3k(w, sb, c):
    h, r, t = c >> 3, (c >> 1) & 3, c & 1
    d1 = ld_f16(w, sb + 108) * np.float32(q3_scale(w, sb, c))
    # the high bit set means no offset: q = low 2 bits + 4 * hbit - 4
    q = vbits2(w, sb + 32 + h * 32 + t * 16, 2 * r, 3, sb + t * 16, h * 4 + r, 1, 2)
    return vmul(vsplat(d1), vsub(q, vsplat(np.float32(4.0))))


@njit(inline="always")
def chunk_q8k(w, sb, c):
    return vmul(vsplat(ld_f32(w, sb)), vload_i8(w, sb + 4 + c * 16))


@njit(inline="always")
def _q5(w, sb, c, hdr):
    """Q5_0 / Q5_1 quants 16c .. 16c + 15 (0..31) of the 32-weight block at sb: nibbles at
    hdr + 4, fifth bits in the 32-bit word at hdr."""
    hb = vbit16(w, sb + hdr + 2 * c)
    return vadd(vbits(w, sb + hdr + 4, 4 * c, 15), vmul(hb, vsplat(np.float32(16.0))))


@njit(inline="always")
def chunk_q5_0(w, sb, c):
    """d * (q - 16), as ggml and gguf-py round it (once)."""
    return vmul(vsplat(ld_f16(w, sb)), vsub(_q5(w, sb, c, 2), vsplat(np.float32(16.0))))


@njit(inline="always")
def chunk_q5_1(w, sb, c):
    """d * q + m (two roundings, as Q4_1)."""
    return vadd(vmul(vsplat(ld_f16(w, sb)), _q5(w, sb, c, 4)), vsplat(ld_f16(w, sb + 2)))


@njit(inline="always")
def kq_chunk(w, qt, sb, c):
    """Weights 16c .. 16c + 15 of the block at byte offset sb, as float32 lanes."""
    if qt == Q5_0:
        return chunk_q5_0(w, sb, c)
    if qt == Q5_1:
        return chunk_q5_1(w, sb, c)
    if qt == Q4_K:
        return chunk_q4k(w, sb, c)
    if qt == Q6_K:
        return chunk_q6k(w, sb, c)
    if qt == Q5_K:
        return chunk_q5k(w, sb, c)
    if qt == Q2_K:
        return chunk_q2k(w, sb, c)
    if qt == Q3_K:
        return chunk_q3k(w, sb, c)
    return chunk_q8k(w, sb, c)


@njit(inline="always")
def kq_dequant_row(w, qt, n, K, dst, dst_off):
    """dst.flat[dst_off : dst_off + K] = row n of w (uint8 [N, row_bytes]), decoded."""
    r = n * w.shape[1]
    bb = kq_block_bytes(qt)
    bw = 32 if qt == Q5_0 or qt == Q5_1 else 256  # weights per block
    for s in range(K // bw):
        for c in range(bw // 16):
            vstore(dst, dst_off + s * bw + c * 16, kq_chunk(w, qt, r + s * bb, c))
