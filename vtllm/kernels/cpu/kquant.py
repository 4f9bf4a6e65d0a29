"""K-quant weights (GGML super-blocks of 256), and Q5_0 / Q5_1 (blocks of 32), decoded to
float32 lanes inside CPU kernels.

Every super-block splits into 16 chunks of 16 consecutive weights, and each chunk has one
scale (and for Q2_K / Q4_K / Q5_K one minimum). Each type has two decoders: `prep_*` unpacks
a super-block's 16 chunk scales and minimums at once (vector ops), `chunk_*` then decodes
chunk c as 16 float32 lanes, computed as ggml and gguf-py compute them:

  Q2_K  (d * (sc & 15)) * q - (dmin * (sc >> 4))    q in 0..3, a scale byte per chunk
  Q3_K  (d * (sc - 32)) * q                         q in -4..3, 6-bit scales
  Q4_K  (d * sc) * q - (dmin * m)                   q in 0..15, 6-bit sc / m per 32 weights
  Q5_K  as Q4_K                                     q in 0..31
  Q6_K  (d * sc) * q                                q in -32..31, an int8 scale per chunk
  Q8_K  d * q                                       d float32, q int8
  Q5_0  d * (q - 16), Q5_1 d * q + m                q in 0..31, 2 chunks per 32-weight block

(parenthesised products are rounded to float32 first). The linear kernels, their GEMM tiles
and the embedding all decode with these functions, so a weight is the same float in each.
Only inline functions here: nothing compiles until a kernel that uses them does.
"""

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from vtllm.kernels import KQUANT_BYTES, Q5_BYTES, QType
from vtllm.kernels.cpu._kq8simd import _Mem, _scales
from vtllm.kernels.cpu._simd import (
    _F32,
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
    vfma,
    vload_i8,
    vmul,
    vsplat,
    vstore,
    vsub,
    vzero,
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
def vq5(typingctx, w, off, c):
    """Float lanes of Q5 quants 16c + i (0..31) of the 32-weight block whose fifth bits (a
    32-bit little-endian word) sit at byte off and nibbles at off + 4: nibble | bit << 4,
    combined in integers (one conversion)."""
    if not _check_array(w, (types.uint8,)):
        return None

    def codegen(context, builder, sig, args):
        off = _intp(context, builder, sig, args, 1)
        c = builder.trunc(_intp(context, builder, sig, args, 2), _I32)
        i64 = ir.IntType(64)
        hptr = _ptr(context, builder, sig.args[0], args[0], off)
        word = builder.zext(_load_vec(builder, hptr, ir.IntType(32)), _I32)
        vec = builder.insert_element(ir.Constant(_VI32, ir.Undefined), word, ir.Constant(_I32, 0))
        vec = builder.shuffle_vector(vec, vec, ir.Constant(_VI32, [0] * LANES))
        c16 = builder.mul(c, ir.Constant(_I32, 16))
        shifts = builder.add(ir.Constant(_VI32, list(range(LANES))), _splat_i32(builder, c16))
        hb = builder.shl(
            builder.and_(builder.lshr(vec, shifts), _splat_i32(builder, ir.Constant(_I32, 1))),
            _splat_i32(builder, ir.Constant(_I32, 4)),
        )
        qptr = _ptr(context, builder, sig.args[0], args[0], builder.add(off, ir.Constant(i64, 4)))
        raw = builder.zext(_load_vec(builder, qptr, ir.VectorType(ir.IntType(8), 16)), _VI32)
        nib = builder.and_(
            builder.lshr(raw, _splat_i32(builder, builder.mul(c, ir.Constant(_I32, 4)))),
            _splat_i32(builder, ir.Constant(_I32, 15)),
        )
        return builder.sitofp(builder.or_(nib, hb), _VF)

    return V16(w, off, c), codegen


def _splat_i32(builder, v):
    vec = builder.insert_element(ir.Constant(_VI32, ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(vec, vec, ir.Constant(_VI32, [0] * LANES))


_SCALE_AT = {"q2_k": (80, 82), "q3_k": (108, -1), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208, -1)}


def _prep(kind):
    """prep(w, sb) -> (D, M): a super-block's 16 chunk scales d * sc and minimums dmin * m as
    float32 lanes (M zero where the type has none), each lane rounded once as ggml rounds it.
    Unpacked with vector ops once per super-block, so the chunk loop only picks lanes."""

    def typer(typingctx, w, sb):
        if not _check_array(w, (types.uint8,)):
            return None

        def codegen(context, builder, sig, args):
            mem = _Mem(
                context, builder, sig.args[0], args[0], _intp(context, builder, sig, args, 1)
            )
            sc, m = _scales(builder, kind, mem)

            def times(lanes, off):
                idx = builder.add(mem.base, ir.Constant(ir.IntType(64), off))
                ptr = _ptr(context, builder, sig.args[0], args[0], idx)
                raw = builder.load(builder.bitcast(ptr, ir.IntType(16).as_pointer()), align=1)
                d = builder.fpext(builder.bitcast(raw, ir.HalfType()), _F32)
                vec = builder.insert_element(
                    ir.Constant(_VF, ir.Undefined), d, ir.Constant(_I32, 0)
                )
                splat = builder.shuffle_vector(vec, vec, ir.Constant(_VI32, [0] * LANES))
                return builder.fmul(builder.sitofp(lanes, _VF), splat)

            d_off, m_off = _SCALE_AT[kind]
            dv = times(sc, d_off)
            mv = times(m, m_off) if m is not None else ir.Constant(_VF, [0.0] * LANES)
            return context.make_tuple(builder, sig.return_type, [dv, mv])

        return types.UniTuple(V16, 2)(w, sb), codegen

    return intrinsic(typer)


prep_q2k, prep_q3k, prep_q4k, prep_q5k, prep_q6k = (
    _prep(k) for k in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")
)


@intrinsic
def vlane(typingctx, v, i):
    """Lane i of v (a runtime index) in every lane."""
    if v != V16:
        return None

    def codegen(context, builder, sig, args):
        idx = builder.trunc(_intp(context, builder, sig, args, 1), _I32)
        x = builder.extract_element(args[0], idx)
        vec = builder.insert_element(ir.Constant(_VF, ir.Undefined), x, ir.Constant(_I32, 0))
        return builder.shuffle_vector(vec, vec, ir.Constant(_VI32, [0] * LANES))

    return V16(v, i), codegen


@njit(inline="always")
def no_prep(w, sb):
    """prep for types whose chunks need no per-block set-up (Q5_0, Q5_1, Q8_K)."""
    return vzero(), vzero()


# ---- one decoder per type: (w, byte offset of the super-block, chunk) -> 16 float32 lanes.
# Kernels call the type's own decoder (a branch per type inside every inlined call site would
# multiply the code numba and LLVM compile by the number of types).


@njit(inline="always")
def _chunk_q4k_q5k(w, sb, c, p, five):
    j, t = c >> 1, c & 1  # 32-weight sub-block, half of it
    if five:
        lo = sb + 48 + (j >> 1) * 32 + t * 16
        q = vbits2(w, lo, (j & 1) * 4, 15, sb + 16 + t * 16, j, 1, 4)
    else:
        q = vbits(w, sb + 16 + (j >> 1) * 32 + t * 16, (j & 1) * 4, 15)
    return vsub(vmul(vlane(p[0], c), q), vlane(p[1], c))


@njit(inline="always")
def chunk_q4k(w, sb, c, p):
    return _chunk_q4k_q5k(w, sb, c, p, False)


@njit(inline="always")
def chunk_q5k(w, sb, c, p):
    return _chunk_q4k_q5k(w, sb, c, p, True)


@njit(inline="always")
def chunk_q6k(w, sb, c, p):
    h, r, t = c >> 3, (c >> 1) & 3, c & 1  # 128-weight half, 32-weight part of it, 16 of those
    lo = sb + h * 64 + (r & 1) * 32 + t * 16
    q = vbits2(w, lo, (r >> 1) * 4, 15, sb + 128 + h * 32 + t * 16, 2 * r, 3, 4)
    return vmul(vlane(p[0], c), vsub(q, vsplat(np.float32(32.0))))


@njit(inline="always")
def chunk_q2k(w, sb, c, p):
    h, r, t = c >> 3, (c >> 1) & 3, c & 1
    q = vbits(w, sb + 16 + h * 32 + t * 16, 2 * r, 3)
    return vsub(vmul(vlane(p[0], c), q), vlane(p[1], c))


@njit(inline="always")
def chunk_q3k(w, sb, c, p):
    h, r, t = c >> 3, (c >> 1) & 3, c & 1
    # the high bit set means no offset: q = low 2 bits + 4 * hbit - 4
    q = vbits2(w, sb + 32 + h * 32 + t * 16, 2 * r, 3, sb + t * 16, h * 4 + r, 1, 2)
    return vmul(vlane(p[0], c), vsub(q, vsplat(np.float32(4.0))))


@njit(inline="always")
def chunk_q8k(w, sb, c, p):
    return vmul(vsplat(ld_f32(w, sb)), vload_i8(w, sb + 4 + c * 16))


@njit(inline="always")
def chunk_q5_0(w, sb, c, p):
    """d * (q - 16) with one rounding, as ggml and gguf-py round it: fma(d, q, -16 d) is that
    same rounding (16 d is exact), one op less."""
    d = ld_f16(w, sb)
    return vfma(vsplat(d), vq5(w, sb + 2, c), vsplat(d * np.float32(-16.0)))


@njit(inline="always")
def chunk_q5_1(w, sb, c, p):
    """d * q + m (two roundings, as Q4_1)."""
    return vadd(vmul(vsplat(ld_f16(w, sb)), vq5(w, sb + 4, c)), vsplat(ld_f16(w, sb + 2)))


@njit(inline="always")
def kq_dequant_row(w, qt, n, K, dst, dst_off):
    """dst.flat[dst_off : dst_off + K] = row n of w (uint8 [N, row_bytes]), decoded (a
    runtime qt: the embedding's one kernel for every type)."""
    if qt == Q4_K:
        _row(w, n, K, dst, dst_off, prep_q4k, chunk_q4k, BB_Q4_K, 256)
    elif qt == Q6_K:
        _row(w, n, K, dst, dst_off, prep_q6k, chunk_q6k, BB_Q6_K, 256)
    elif qt == Q5_K:
        _row(w, n, K, dst, dst_off, prep_q5k, chunk_q5k, BB_Q5_K, 256)
    elif qt == Q3_K:
        _row(w, n, K, dst, dst_off, prep_q3k, chunk_q3k, BB_Q3_K, 256)
    elif qt == Q2_K:
        _row(w, n, K, dst, dst_off, prep_q2k, chunk_q2k, BB_Q2_K, 256)
    elif qt == Q8_K:
        _row(w, n, K, dst, dst_off, no_prep, chunk_q8k, BB_Q8_K, 256)
    elif qt == Q5_0:
        _row(w, n, K, dst, dst_off, no_prep, chunk_q5_0, BB_Q5_0, 32)
    else:
        _row(w, n, K, dst, dst_off, no_prep, chunk_q5_1, BB_Q5_1, 32)


@njit(inline="always")
def _row(w, n, K, dst, dst_off, prep, chunk, bb, bw):
    r = n * w.shape[1]
    for s in range(K // bw):
        p = prep(w, r + s * bb)
        for c in range(bw // 16):
            vstore(dst, dst_off + s * bw + c * 16, chunk(w, r + s * bb, c, p))
