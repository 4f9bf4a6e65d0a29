"""Explicit 16-lane float32 vectors for numba kernels (a private helper of the CPU kernels).
Long (over 400 lines) because it is one vocabulary: each intrinsic is a few lines of LLVM IR,
and splitting them over modules would only scatter what the kernels import together.

Why: batch invariance needs one fixed floating-point order per output element, and speed needs
SIMD. Auto-vectorization without fastmath cannot reorder a reduction, and with fastmath the
order depends on what LLVM happened to do in each code path. So the kernels spell the lanes
out: a `V16` value is an LLVM <16 x float> living in registers, every op below is one
elementwise IEEE op (fma is a true fused multiply-add everywhere), and `hsum` reduces the 16
lanes in one fixed tree. Any two code paths written with these ops compute the same bits.
"""

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model

LANES = 16


class V16Type(types.Type):
    def __init__(self):
        super().__init__(name="V16")


V16 = V16Type()
_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, LANES)
_VI32 = ir.VectorType(ir.IntType(32), LANES)


def carray(dtype, ndim: int, readonly: bool = False):
    """numba type of a C-contiguous array for explicit kernel signatures. Inputs are typed
    readonly: that also takes writable arrays, and lets read-only memory maps (weights) in."""
    return types.Array(dtype, ndim, "C", readonly=readonly)


def _I32(v):
    return ir.Constant(ir.IntType(32), v)


def _ivec(values):
    """Constant <n x i32> (shuffle masks, shift counts)."""
    return ir.Constant(ir.VectorType(ir.IntType(32), len(values)), list(values))


@register_model(V16Type)
class _V16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VF)


def _ptr(context, builder, aryty, ary, off):
    """Address of element `off` of a C-contiguous array, as flat index (any ndim)."""
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.gep(data, [off])


def _load_vec(builder, ptr, vty):
    return builder.load(builder.bitcast(ptr, vty.as_pointer()), typ=vty, align=1)


def _check_array(arr, dtypes):
    return isinstance(arr, types.Array) and arr.dtype in dtypes and arr.layout == "C"


def _widen16(builder, raw, kind):
    """i16 bits -> float32: IEEE half (exact fpext, subnormals included) or bfloat16."""
    if kind == "f16":
        return builder.fpext(builder.bitcast(raw, ir.HalfType()), _F32)
    return builder.bitcast(builder.shl(builder.zext(raw, ir.IntType(32)), _I32(16)), _F32)


def _scalar_load(kind):
    """One stored weight at a flat (byte, for uint8) offset, widened to float32; unaligned ok."""

    def typer(typingctx, arr, off):
        if not _check_array(arr, (types.uint8, types.uint16, types.float32)):
            return None

        def codegen(context, builder, sig, args):
            off = context.cast(builder, args[1], sig.args[1], types.intp)
            ptr = _ptr(context, builder, sig.args[0], args[0], off)
            if kind == "f32":
                return _load_vec(builder, ptr, _F32)
            return _widen16(builder, _load_vec(builder, ptr, ir.IntType(16)), kind)

        return types.float32(arr, off), codegen

    return intrinsic(typer)


ld_f32 = _scalar_load("f32")
ld_f16 = _scalar_load("f16")  # exact, subnormals included (vcvtsh2ss / compiler-rt)
ld_bf16 = _scalar_load("bf16")


def _bits_to_f32(kind):
    def typer(typingctx, bits):
        if not isinstance(bits, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            raw = builder.zext(args[0], ir.IntType(32)) if bits.bitwidth < 32 else args[0]
            return _widen16(builder, builder.trunc(raw, ir.IntType(16)), kind)

        return types.float32(bits), codegen

    return intrinsic(typer)


f16_to_f32 = _bits_to_f32("f16")  # IEEE half bits (low 16 bits of an integer) -> float32
bf16_to_f32 = _bits_to_f32("bf16")


def _call_llvm(builder, name, vty, args):
    fnty = ir.FunctionType(vty, [a.type for a in args])
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    return builder.call(fn, args)


@intrinsic
def vzero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VF, [0.0] * LANES)

    return V16(), codegen


@intrinsic
def vsplat(typingctx, x):
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        vec = builder.insert_element(ir.Constant(_VF, ir.Undefined), v, _I32(0))
        return builder.shuffle_vector(vec, vec, _ivec([0] * LANES))

    return V16(x), codegen


@intrinsic
def vload(typingctx, arr, off):
    """16 float32 at flat offset `off` of a C-contiguous float32 array (or byte offset of uint8)."""
    if not _check_array(arr, (types.float32, types.uint8)):
        return None

    def codegen(context, builder, sig, args):
        off = context.cast(builder, args[1], sig.args[1], types.intp)
        return _load_vec(builder, _ptr(context, builder, sig.args[0], args[0], off), _VF)

    return V16(arr, off), codegen


@intrinsic
def vstore(typingctx, arr, off, v):
    """arr.flat[off : off + 16] = v."""
    if not _check_array(arr, (types.float32,)) or v != V16:
        return None

    def codegen(context, builder, sig, args):
        off = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = _ptr(context, builder, sig.args[0], args[0], off)
        builder.store(args[2], builder.bitcast(ptr, _VF.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.none(arr, off, v), codegen


def _convert(kind):
    """Loads 16 stored weights at a flat offset and widens them to float32 lanes."""

    def typer(typingctx, arr, off):
        if not _check_array(arr, (types.uint8, types.int8, types.uint16)):
            return None

        def codegen(context, builder, sig, args):
            off = context.cast(builder, args[1], sig.args[1], types.intp)
            ptr = _ptr(context, builder, sig.args[0], args[0], off)
            if kind in ("q4lo", "q4hi"):  # 16 bytes of nibble pairs -> 16 unsigned nibbles
                raw = _load_vec(builder, ptr, ir.VectorType(ir.IntType(8), LANES))
                wide = builder.zext(raw, _VI32)
                if kind == "q4lo":
                    wide = builder.and_(wide, _ivec([15] * LANES))
                else:
                    wide = builder.lshr(wide, _ivec([4] * LANES))
                return builder.sitofp(wide, _VF)
            if kind == "i8":  # 16 signed bytes
                raw = _load_vec(builder, ptr, ir.VectorType(ir.IntType(8), LANES))
                return builder.sitofp(builder.sext(raw, _VI32), _VF)
            raw = _load_vec(builder, ptr, ir.VectorType(ir.IntType(16), LANES))
            if kind == "f16":  # IEEE half bits; fpext is exact (vcvtph2ps)
                half = builder.bitcast(raw, ir.VectorType(ir.HalfType(), LANES))
                return builder.fpext(half, _VF)
            # bf16 bits are the top half of a float32
            wide = builder.shl(builder.zext(raw, _VI32), _ivec([16] * LANES))
            return builder.bitcast(wide, _VF)

        return V16(arr, off), codegen

    return intrinsic(typer)


vload_q4lo = _convert("q4lo")  # low nibbles: elements j of a Q4 block
vload_q4hi = _convert("q4hi")  # high nibbles: elements j + 16
vload_i8 = _convert("i8")
vload_f16 = _convert("f16")
vload_bf16 = _convert("bf16")


def _binop(op):
    def typer(typingctx, a, b):
        if a != V16 or b != V16:
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])

        return V16(a, b), codegen

    return intrinsic(typer)


vadd = _binop("fadd")
vsub = _binop("fsub")
vmul = _binop("fmul")
vdiv = _binop("fdiv")


def _select(pred):
    def typer(typingctx, a, b):
        if a != V16 or b != V16:
            return None

        def codegen(context, builder, sig, args):
            take_b = builder.fcmp_ordered(pred, args[0], args[1])
            return builder.select(take_b, args[1], args[0])

        return V16(a, b), codegen

    return intrinsic(typer)


vmax = _select("<")  # lane-wise; NaN lanes of `a` stay NaN
vmin = _select(">")


@intrinsic
def vfloor(typingctx, v):
    if v != V16:
        return None

    def codegen(context, builder, sig, args):
        return _call_llvm(builder, "llvm.floor.v16f32", _VF, [args[0]])

    return V16(v), codegen


@intrinsic
def vexp2i(typingctx, v):
    """2**n for lanes holding whole numbers n in [-126, 127] (built in the exponent bits)."""
    if v != V16:
        return None

    def codegen(context, builder, sig, args):
        biased = builder.add(builder.fptosi(args[0], _VI32), _ivec([127] * LANES))
        return builder.bitcast(builder.shl(biased, _ivec([23] * LANES)), _VF)

    return V16(v), codegen


@intrinsic
def lane0(typingctx, v):
    if v != V16:
        return None

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], _I32(0))

    return types.float32(v), codegen


@intrinsic
def vfma(typingctx, a, b, c):
    """a * b + c with one rounding (llvm.fma: a real FMA instruction on AVX2/AVX-512)."""
    if a != V16 or b != V16 or c != V16:
        return None

    def codegen(context, builder, sig, args):
        return _call_llvm(builder, "llvm.fma.v16f32", _VF, list(args))

    return V16(a, b, c), codegen


@intrinsic
def fma32(typingctx, a, b, c):
    """Scalar float32 fused multiply-add (same rounding as one lane of vfma)."""
    if not all(t == types.float32 for t in (a, b, c)):
        return None

    def codegen(context, builder, sig, args):
        return _call_llvm(builder, "llvm.fma.f32", _F32, list(args))

    return types.float32(a, b, c), codegen


@intrinsic
def hsum(typingctx, v):
    """Sum of the 16 lanes in a fixed tree: halves, then quarters, ... (never reassociated)."""
    if v != V16:
        return None

    def codegen(context, builder, sig, args):
        x = args[0]
        width = LANES
        while width > 1:  # lane i of the next level = lane i + lane i + width/2
            width //= 2
            lo = builder.shuffle_vector(x, x, _ivec(range(width)))
            hi = builder.shuffle_vector(x, x, _ivec(range(width, 2 * width)))
            x = builder.fadd(lo, hi)
        return builder.extract_element(x, _I32(0))

    return types.float32(v), codegen


@intrinsic
def hmax(typingctx, v):
    """Largest lane (exact whatever the order)."""
    if v != V16:
        return None

    def codegen(context, builder, sig, args):
        x, width = args[0], LANES
        while width > 1:
            width //= 2
            lo = builder.shuffle_vector(x, x, _ivec(range(width)))
            hi = builder.shuffle_vector(x, x, _ivec(range(width, 2 * width)))
            x = builder.select(builder.fcmp_ordered("<", lo, hi), hi, lo)
        return builder.extract_element(x, _I32(0))

    return types.float32(v), codegen


def _hsum16_codegen(context, builder, sig, args):
    level = list(args)
    group = LANES  # lanes holding one input vector's partial sums, in each `level` vector
    while len(level) > 1:
        half = group // 2
        lo = [g * group + i for g in range(LANES // group) for i in range(half)]
        lo += [LANES + j for j in lo]  # then the same lanes of the pair's second vector
        hi = [j + half for j in lo]
        pairs = zip(level[0::2], level[1::2], strict=True)
        level = [
            builder.fadd(
                builder.shuffle_vector(a, b, _ivec(lo)), builder.shuffle_vector(a, b, _ivec(hi))
            )
            for a, b in pairs
        ]
        group = half
    return level[0]


@intrinsic
def hsum16(typingctx, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15):
    """Lane k = hsum(a_k), bit for bit: hsum's tree run on 16 vectors at once (each level's
    shuffles and adds serve a pair of vectors), about 3 ops per sum instead of 8."""
    vs = (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15)
    if any(v != V16 for v in vs):
        return None
    return V16(*vs), _hsum16_codegen


# Cephes expf: n = round(x / ln2), r = x - n*ln2 in two pieces, exp(r) by a degree-7 polynomial.
# Within 2 ulp of exp on [-87, 88]; inputs outside are clamped there (exp(-87) ~ 1.6e-38).
_EXP_LO, _EXP_HI = np.float32(-87.0), np.float32(88.0)
_LOG2E = np.float32(1.44269504088896341)
_C1, _C2 = np.float32(0.693359375), np.float32(-2.12194440e-4)
_P0, _P1, _P2, _P3, _P4, _P5 = (
    np.float32(c)
    for c in (
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        0.5,
    )
)


@njit(inline="always")
def vexp(x):
    """Lane-wise exp(x), the same bits in every kernel and every lane position."""
    x = vmin(vmax(x, vsplat(_EXP_LO)), vsplat(_EXP_HI))
    n = vfloor(vfma(x, vsplat(_LOG2E), vsplat(np.float32(0.5))))
    r = vfma(n, vsplat(-_C2), vfma(n, vsplat(-_C1), x))
    p = vsplat(_P0)
    p = vfma(p, r, vsplat(_P1))
    p = vfma(p, r, vsplat(_P2))
    p = vfma(p, r, vsplat(_P3))
    p = vfma(p, r, vsplat(_P4))
    p = vfma(p, r, vsplat(_P5))
    p = vfma(p, vmul(r, r), vadd(r, vsplat(np.float32(1.0))))
    return vmul(p, vexp2i(n))


@njit(inline="always")
def exp32(x):
    """Scalar exp with exactly vexp's arithmetic (for tails that are not 16 wide)."""
    return lane0(vexp(vsplat(x)))
