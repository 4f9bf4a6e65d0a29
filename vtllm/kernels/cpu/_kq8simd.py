"""Integer super-block dot products of K-quant weights and q8_K activations (the int8 path).

A super-block of 256 weights is 4 groups of 64; a group's weights, unpacked to 64 unsigned
bytes in element order, meet 64 activation bytes in one vpdpbusd (`_int8simd.dpbusd_small`): int32
lane k of group g sums the 4 products of elements 64g + 4k .. 64g + 4k + 3, all inside
16-weight chunk 4g + k // 4. Each lane is then multiplied by its chunk's integer scale and the
4 groups are added lane by lane:

    isum[k] = sum_g S[4g + k // 4] * dot_g[k]  -  off * S[k] * B[k]

S are the 16 chunk scales (Q4_K / Q5_K: the 6-bit scale of the chunk's 32-weight sub-block;
Q6_K / Q3_K signed), B the activation's 16 chunk sums, off the unsigned quants' offset (Q6_K
32, Q3_K 4). Types with minimums also give msum[k] = M[k] * B[k]. All integer, so any order
gives the same lanes (llama.cpp's ggml_vec_dot_q*_K_q8_K sums the same integers).

Every intrinsic is generated per type (`kind`) with its unpacking spelled out in IR with
constant shuffles; the GEMV reads the stored blocks (`isum_raw`), the GEMM tile unpacks them
once into scratch (`unpack`) and reads that (`isum_tile`): the same integers either way.
"""

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from vtllm.kernels.cpu._int8simd import I16, INT8_VARIANT, dpbusd_ir
from vtllm.kernels.cpu._simd import _check_array, _ivec, _ptr

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_VI = ir.VectorType(_I32, 16)
OFFSET = {"q2_k": 0, "q3_k": 4, "q4_k": 0, "q5_k": 0, "q6_k": 32}
HAS_MIN = {"q2_k": True, "q3_k": False, "q4_k": True, "q5_k": True, "q6_k": False}


class _Mem:
    """Loads from one array argument at (runtime base + constant) flat offsets."""

    def __init__(self, context, builder, aryty, ary, base):
        self.c, self.b, self.t, self.a, self.base = context, builder, aryty, ary, base

    def load(self, off, n, elem=_I8):
        idx = self.b.add(self.base, ir.Constant(_I64, off))
        ptr = self.b.bitcast(
            _ptr(self.c, self.b, self.t, self.a, idx), ir.VectorType(elem, n).as_pointer()
        )
        return self.b.load(ptr, align=1)


def _bytes(b, n, v):
    return ir.Constant(ir.VectorType(_I8, n), [v] * n)


def _field(b, v32, shift, mask):
    """(v >> shift) & mask on a <32 x i8> (uniform shift: vpsrlw + vpand)."""
    if shift:
        v32 = b.lshr(v32, _bytes(b, 32, shift))
    return b.and_(v32, _bytes(b, 32, mask))


def _cat(b, lo, hi):
    return b.shuffle_vector(lo, hi, _ivec(range(64)))


def _group(b, kind, mem, g):
    """64 unsigned weight bytes of group g of the stored super-block."""
    h, j0 = g >> 1, 2 * (g & 1)  # 128-weight half; Q2_K / Q3_K: first shift pair of the group
    if kind in ("q4_k", "q5_k"):
        qs = mem.load((48 if kind == "q5_k" else 16) + 32 * g, 32)
        lo, hi = _field(b, qs, 0, 15), _field(b, qs, 4, 15)
        if kind == "q5_k":
            qh = mem.load(16, 32)
            lo = b.or_(lo, b.shl(_field(b, qh, 2 * g, 1), _bytes(b, 32, 4)))
            hi = b.or_(hi, b.shl(_field(b, qh, 2 * g + 1, 1), _bytes(b, 32, 4)))
        return _cat(b, lo, hi)
    if kind == "q6_k":
        gg = g & 1
        ql = mem.load(64 * h, 64)
        nib = b.and_(b.lshr(ql, _bytes(b, 64, 4 * gg)) if gg else ql, _bytes(b, 64, 15))
        qh = mem.load(128 + 32 * h, 32)
        hb = _cat(b, _field(b, qh, 4 * gg, 3), _field(b, qh, 4 * gg + 2, 3))
        return b.or_(nib, b.shl(hb, _bytes(b, 64, 4)))
    if kind == "q2_k":
        qs = mem.load(16 + 32 * h, 32)
        return _cat(b, _field(b, qs, 2 * j0, 3), _field(b, qs, 2 * j0 + 2, 3))
    qs = mem.load(32 + 32 * h, 32)  # q3_k: 2 low bits, and the high bit from hmask
    hm = mem.load(0, 32)
    lo = b.or_(_field(b, qs, 2 * j0, 3), b.shl(_field(b, hm, 4 * h + j0, 1), _bytes(b, 32, 2)))
    hi = b.or_(
        _field(b, qs, 2 * j0 + 2, 3), b.shl(_field(b, hm, 4 * h + j0 + 1, 1), _bytes(b, 32, 2))
    )
    return _cat(b, lo, hi)


def _ivconst(values):
    return ir.Constant(_VI, [int(v) for v in values])


def _lanes(b, raw, idx):
    """<16 x i32>: zero-extended bytes raw[idx[c]] (raw a byte vector)."""
    return b.zext(b.shuffle_vector(raw, raw, _ivec(idx)), _VI)


def _scales(b, kind, mem):
    """(S, M): the 16 chunk scales and minimums (M None where the type has none), <16 x i32>."""
    c = range(16)
    if kind in ("q4_k", "q5_k"):  # ggml's get_scale_min_k4, one lane per chunk (j = c // 2)
        s = mem.load(4, 12)
        j = [k // 2 for k in c]
        low = [x < 4 for x in j]
        a = _lanes(b, s, [x if x < 4 else x + 4 for x in j])  # s[j] (j < 4) or s[j + 4]
        top = b.shl(
            b.lshr(_lanes(b, s, [x - 4 if x >= 4 else 0 for x in j]), _ivconst([6] * 16)),
            _ivconst([4] * 16),
        )
        sc = b.or_(
            b.and_(a, _ivconst([63 if lo else 15 for lo in low])),
            b.and_(top, _ivconst([0 if lo else 48 for lo in low])),
        )
        m_a = _lanes(b, s, [x + 4 for x in j])  # s[j + 4]
        m_top = b.shl(b.lshr(_lanes(b, s, j), _ivconst([6] * 16)), _ivconst([4] * 16))
        m = b.select(
            ir.Constant(ir.VectorType(ir.IntType(1), 16), low),
            b.and_(m_a, _ivconst([63] * 16)),
            b.or_(b.lshr(m_a, _ivconst([4] * 16)), m_top),
        )
        return sc, m
    if kind == "q6_k":
        return b.sext(mem.load(192, 16), _VI), None
    if kind == "q2_k":
        raw = b.zext(mem.load(0, 16), _VI)
        return b.and_(raw, _ivconst([15] * 16)), b.lshr(raw, _ivconst([4] * 16))
    s = mem.load(96, 12)  # q3_k: low nibbles in bytes 0..7, high 2-bit pairs in 8..11
    lo = b.and_(
        b.lshr(_lanes(b, s, [k & 7 for k in c]), _ivconst([4 * (k >> 3) for k in c])),
        _ivconst([15] * 16),
    )
    hi = b.and_(
        b.lshr(_lanes(b, s, [8 + (k & 3) for k in c]), _ivconst([2 * (k >> 2) for k in c])),
        _ivconst([3] * 16),
    )
    return b.sub(b.or_(lo, b.shl(hi, _ivconst([4] * 16))), _ivconst([32] * 16)), None


def _dp(b, u, s):
    """vpdpbusd from zero lanes; unpacked K-quant weights are at most 63, so the small form."""
    return dpbusd_ir(b, ir.Constant(_VI, [0] * 16), u, s, INT8_VARIANT, small=True)


def _isum(b, kind, groups, sc, xmem, bsum):
    acc = None
    for g, wg in enumerate(groups):
        lanes = b.shuffle_vector(sc, sc, _ivec([4 * g + k // 4 for k in range(16)]))
        term = b.mul(lanes, _dp(b, wg, xmem.load(64 * g, 64)))
        acc = term if acc is None else b.add(acc, term)
    if OFFSET[kind]:
        acc = b.sub(acc, b.mul(b.mul(sc, bsum), _ivconst([OFFSET[kind]] * 16)))
    return acc


def _mem(context, builder, sig, args, i):
    base = context.cast(builder, args[i + 1], sig.args[i + 1], types.intp)
    return _Mem(context, builder, sig.args[i], args[i], base)


def _bsum(context, builder, sig, args, i):
    return _mem(context, builder, sig, args, i).load(0, 16, _I32)


def _u8(a):
    return _check_array(a, (types.uint8,))


def isum_raw(kind):
    """isum_raw(w, sb, xq, xo, xb, bo): isum of the stored super-block at byte sb of w against
    activation bytes xq[xo : xo + 256] with chunk sums xb[bo : bo + 16]."""

    def typer(typingctx, w, sb, xq, xo, xb, bo):
        if not (_u8(w) and _check_array(xq, (types.int8,)) and _check_array(xb, (types.int32,))):
            return None

        def codegen(context, builder, sig, args):
            mem = _mem(context, builder, sig, args, 0)
            groups = [_group(builder, kind, mem, g) for g in range(4)]
            sc, _ = _scales(builder, kind, mem)
            xmem = _mem(context, builder, sig, args, 2)
            return _isum(builder, kind, groups, sc, xmem, _bsum(context, builder, sig, args, 4))

        return I16(w, sb, xq, xo, xb, bo), codegen

    return intrinsic(typer)


def msum_raw(kind):
    """msum_raw(w, sb, xb, bo): M * B lanes of the stored super-block (types with minimums)."""

    def typer(typingctx, w, sb, xb, bo):
        if not (_u8(w) and _check_array(xb, (types.int32,))):
            return None

        def codegen(context, builder, sig, args):
            _, m = _scales(builder, kind, _mem(context, builder, sig, args, 0))
            return builder.mul(m, _bsum(context, builder, sig, args, 2))

        return I16(w, sb, xb, bo), codegen

    return intrinsic(typer)


def unpack(kind):
    """unpack(w, sb, tb, to, ts, so): the stored super-block as 256 unsigned bytes at tb[to]
    and S, M (zeros where none) as 32 int32 at ts[so]: what isum_tile / msum_tile read."""

    def typer(typingctx, w, sb, tb, to, ts, so):
        if not (_u8(w) and _u8(tb) and _check_array(ts, (types.int32,))):
            return None

        def codegen(context, builder, sig, args):
            mem = _mem(context, builder, sig, args, 0)
            tmem = _mem(context, builder, sig, args, 2)
            for g in range(4):
                idx = builder.add(tmem.base, ir.Constant(_I64, 64 * g))
                ptr = _ptr(context, builder, sig.args[2], args[2], idx)
                builder.store(
                    _group(builder, kind, mem, g),
                    builder.bitcast(ptr, ir.VectorType(_I8, 64).as_pointer()),
                    align=1,
                )
            sc, m = _scales(builder, kind, mem)
            smem = _mem(context, builder, sig, args, 4)
            for i, v in enumerate((sc, m if m is not None else ir.Constant(_VI, [0] * 16))):
                idx = builder.add(smem.base, ir.Constant(_I64, 16 * i))
                ptr = _ptr(context, builder, sig.args[4], args[4], idx)
                builder.store(v, builder.bitcast(ptr, _VI.as_pointer()), align=1)
            return context.get_dummy_value()

        return types.none(w, sb, tb, to, ts, so), codegen

    return intrinsic(typer)


def isum_tile(kind):
    """isum_tile(tb, to, ts, so, xq, xo, xb, bo): isum_raw from an unpacked super-block."""

    def typer(typingctx, tb, to, ts, so, xq, xo, xb, bo):
        if not (_u8(tb) and _check_array(ts, (types.int32,))):
            return None

        def codegen(context, builder, sig, args):
            tmem = _mem(context, builder, sig, args, 0)
            groups = [tmem.load(64 * g, 64) for g in range(4)]
            sc = _mem(context, builder, sig, args, 2).load(0, 16, _I32)
            xmem = _mem(context, builder, sig, args, 4)
            return _isum(builder, kind, groups, sc, xmem, _bsum(context, builder, sig, args, 6))

        return I16(tb, to, ts, so, xq, xo, xb, bo), codegen

    return intrinsic(typer)


@intrinsic
def msum_tile(typingctx, ts, so, xb, bo):
    """M * B lanes from an unpacked super-block's minimums (ts[so + 16 : so + 32])."""
    if not (_check_array(ts, (types.int32,)) and _check_array(xb, (types.int32,))):
        return None

    def codegen(context, builder, sig, args):
        m = _mem(context, builder, sig, args, 0).load(16, 16, _I32)
        return builder.mul(m, _bsum(context, builder, sig, args, 2))

    return I16(ts, so, xb, bo), codegen
