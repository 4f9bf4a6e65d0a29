"""Explicit int8 vectors for the fast (int8) CPU path, beside _simd's float lanes.

A `B64` value is an LLVM <64 x i8> (two 32-weight blocks side by side), an `I16` value an
<16 x i32>. `dpbusd(acc, u, s)` is VNNI's vpdpbusd: lane i of acc gains the four products
u[4i..4i+3] * s[4i..4i+3] (u unsigned, s signed), exact in int32. How it is spelled depends on
the features of numba's compile target (`INT8_VARIANT`, chosen once at import):

    vnni512   AVX512-VNNI: the LLVM intrinsic `llvm.x86.avx512.vpdpbusd.512`
    avx512bw  AVX-512 without VNNI: vpmaddubsw (pairs -> i16) and vpmaddwd by ones (-> i32)
              on the whole 512-bit vector
    avx2      the same two instructions on the two 256-bit halves (llama.cpp's AVX2 dot)
    generic   plain IR (widen, multiply, add groups of four), which any LLVM target compiles

vpmaddubsw saturates its i16 pair sums, so the madd spellings are exact only where no pair can
pass 32767: with u < 128 and any s, |u0 s0 + u1 s1| <= 2 * 127 * 128 = 32512. `dpbusd_small`
promises that (Q4 / Q5 nibbles, K-quant weights: at most 63) and is one vpmaddubsw per half;
`dpbusd` takes any u (Q8_0's weights plus 128) and splits it into u & 127 and u & 128, whose
pair sums lie in [-32512, 32512] and [-32768, 32512], then adds both i32 sums. Integer sums are
exact, so every variant gives the same bits; tests compare them.

Why intrinsics: numba's plain loop `acc += int32(w[k]) * int32(x[k])` is vectorized by LLVM
with vpmovzxbd / vpmovsxbd widening and 32-bit multiplies (no vpdpbusd, vpmaddubsw or vpmaddwd
in `inspect_asm`): several instructions per product where vpdpbusd does four in one.
"""

import llvmlite.binding as llb
from llvmlite import ir
from numba.core import cgutils, config, types
from numba.core.codegen import get_host_cpu_features
from numba.extending import intrinsic, models, register_model

from vtllm.kernels.cpu._simd import V16, _check_array, _ivec, _ptr

_I8, _I16, _I32, _I64 = (ir.IntType(bits) for bits in (8, 16, 32, 64))
_VB = ir.VectorType(_I8, 64)
_VI = ir.VectorType(_I32, 16)
_VF = ir.VectorType(ir.FloatType(), 16)


def compile_target() -> tuple[str, str]:
    """(CPU name, feature list) of numba's CPU target machine, by numba's own rule:
    NUMBA_CPU_NAME / NUMBA_CPU_FEATURES where set (an empty list: the features the name
    implies), else the host's (less AVX where NUMBA_ENABLE_AVX=0)."""
    name = config.CPU_NAME or llb.get_host_cpu_name()
    features = config.CPU_FEATURES
    return name, get_host_cpu_features() if features is None else features


def _compiles_to(tm, vty, needle: str) -> bool:
    """Whether an add of two `vty` vectors compiles to `needle` on target machine tm."""
    module = ir.Module()
    module.triple = llb.get_process_triple()
    fn = ir.Function(module, ir.FunctionType(vty, [vty, vty]), "probe")
    builder = ir.IRBuilder(fn.append_basic_block())
    builder.ret(builder.add(*fn.args))
    return needle in tm.emit_assembly(llb.parse_assembly(str(module)))


def int8_variant(name: str, features: str) -> str:
    """The dpbusd spelling for a target: AVX2 and AVX512BW are read off what LLVM emits for
    it (a named CPU with an empty feature list hides them from any list), VNNI from the
    feature list only: a target without it must never meet its intrinsic."""
    llb.initialize_native_target()
    llb.initialize_native_asmprinter()
    target = llb.Target.from_triple(llb.get_process_triple())
    tm = target.create_target_machine(cpu=name, features=features)
    if not _compiles_to(tm, ir.VectorType(_I32, 8), "vpaddd\t%ymm"):
        return "generic"
    if not _compiles_to(tm, _VB, "vpaddb\t%zmm"):
        return "avx2"
    return "vnni512" if "+avx512vnni" in features.split(",") else "avx512bw"


INT8_VARIANT = int8_variant(*compile_target())
HAS_VNNI = INT8_VARIANT == "vnni512"


class B64Type(types.Type):
    def __init__(self):
        super().__init__(name="B64")


class I16Type(types.Type):
    def __init__(self):
        super().__init__(name="I16")


B64 = B64Type()
I16 = I16Type()


@register_model(B64Type)
class _B64Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VB)


@register_model(I16Type)
class _I16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VI)


def _load(builder, ptr, vty):
    return builder.load(builder.bitcast(ptr, vty.as_pointer()), typ=vty, align=1)


def _offset(context, builder, sig, args, i):
    return context.cast(builder, args[i], sig.args[i], types.intp)


_BYTES = (types.int8, types.uint8)


@intrinsic
def load_b64(typingctx, arr, off):
    """64 bytes at flat offset off of an int8 / uint8 array."""
    if not _check_array(arr, _BYTES):
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], args[0], _offset(context, builder, sig, args, 1))
        return _load(builder, ptr, _VB)

    return B64(arr, off), codegen


@intrinsic
def store_b64(typingctx, arr, off, v):
    if not _check_array(arr, _BYTES) or v != B64:
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], args[0], _offset(context, builder, sig, args, 1))
        builder.store(args[2], builder.bitcast(ptr, _VB.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.none(arr, off, v), codegen


@intrinsic
def load_i16(typingctx, arr, off):
    """16 int32 at flat offset off of an int32 array."""
    if not _check_array(arr, (types.int32,)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], args[0], _offset(context, builder, sig, args, 1))
        return _load(builder, ptr, _VI)

    return I16(arr, off), codegen


@intrinsic
def izero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VI, [0] * 16)

    return I16(), codegen


def _nibbles(context, builder, sig, args):
    """The 64 nibbles of two Q4 blocks' 16 bytes (args 1, 2: offsets), in element order."""
    ptrs = [
        _ptr(context, builder, sig.args[0], args[0], _offset(context, builder, sig, args, i))
        for i in (1, 2)
    ]
    a, b = (_load(builder, p, ir.VectorType(_I8, 16)) for p in ptrs)
    ab = builder.shuffle_vector(a, b, _ivec(range(32)))
    v = builder.shuffle_vector(ab, ab, _ivec([*range(16)] * 2 + [*range(16, 32)] * 2))
    # high nibbles: a 16-bit shift moves each byte's top nibble down (the bits that cross
    # from the neighbour byte are masked off below)
    words = builder.bitcast(v, ir.VectorType(_I16, 32))
    four = ir.Constant(ir.VectorType(_I16, 32), [4] * 32)
    shifted = builder.bitcast(builder.lshr(words, four), _VB)
    hi_lane = ir.Constant(ir.VectorType(ir.IntType(1), 64), ([0] * 16 + [1] * 16) * 2)
    return builder.and_(builder.select(hi_lane, shifted, v), ir.Constant(_VB, [15] * 64))


@intrinsic
def q4_pair(typingctx, w, off_a, off_b):
    """Weights of two Q4 blocks whose 16 nibble bytes sit at byte offsets off_a and off_b, as
    64 unsigned bytes in element order: a[0..15] (low nibbles), a[16..31] (high), then b."""
    if not _check_array(w, (types.uint8,)):
        return None

    def codegen(context, builder, sig, args):
        return _nibbles(context, builder, sig, args)

    return B64(w, off_a, off_b), codegen


@intrinsic
def q5_pair(typingctx, w, off_a, off_b):
    """Weights of two Q5_0 / Q5_1 blocks (0..31) as 64 unsigned bytes in element order: the
    nibbles at off_a and off_b as q4_pair, plus 16 where bit j of the 32-bit word just before
    them (the block's fifth bits) is set."""
    if not _check_array(w, (types.uint8,)):
        return None

    def codegen(context, builder, sig, args):
        nib = _nibbles(context, builder, sig, args)
        words = []
        for i in (1, 2):
            off = builder.sub(_offset(context, builder, sig, args, i), ir.Constant(_I64, 4))
            words.append(
                _load(
                    builder,
                    _ptr(context, builder, sig.args[0], args[0], off),
                    ir.VectorType(_I8, 4),
                )
            )
        qh = builder.shuffle_vector(words[0], words[1], _ivec(range(8)))
        spread = builder.shuffle_vector(qh, qh, _ivec([j // 8 for j in range(64)]))
        mask = ir.Constant(_VB, [1 << (j % 8) for j in range(64)])
        set_ = builder.icmp_unsigned("!=", builder.and_(spread, mask), ir.Constant(_VB, [0] * 64))
        return builder.or_(
            nib, builder.select(set_, ir.Constant(_VB, [16] * 64), ir.Constant(_VB, [0] * 64))
        )

    return B64(w, off_a, off_b), codegen


@intrinsic
def q8_pair(typingctx, w, off_a, off_b):
    """Weights of two Q8_0 blocks (32 signed bytes each at off_a, off_b) plus 128, as unsigned
    bytes: vpdpbusd multiplies unsigned by signed, and the 128 * sum(x) this adds is taken
    back by the activation's correction lanes."""
    if not _check_array(w, (types.uint8,)):
        return None

    def codegen(context, builder, sig, args):
        ptrs = [
            _ptr(context, builder, sig.args[0], args[0], _offset(context, builder, sig, args, i))
            for i in (1, 2)
        ]
        a, b = (_load(builder, p, ir.VectorType(_I8, 32)) for p in ptrs)
        ab = builder.shuffle_vector(a, b, _ivec(range(64)))
        return builder.xor(ab, ir.Constant(_VB, [0x80] * 64))

    return B64(w, off_a, off_b), codegen


def _half_pair(context, builder, sig, args, extra):
    """Two f16 scalars at byte offsets (args 1, 2) + extra -> <2 x float>."""
    out = ir.Constant(ir.VectorType(ir.FloatType(), 2), ir.Undefined)
    for lane, i in enumerate((1, 2)):
        off = builder.add(_offset(context, builder, sig, args, i), ir.Constant(_I64, extra))
        raw = _load(builder, _ptr(context, builder, sig.args[0], args[0], off), _I16)
        val = builder.fpext(builder.bitcast(raw, ir.HalfType()), ir.FloatType())
        out = builder.insert_element(out, val, ir.Constant(_I32, lane))
    return out


def _halves(extra):
    def typer(typingctx, w, off_a, off_b):
        """[f16 at off_a + extra] * 8 ++ [f16 at off_b + extra] * 8 as float32 lanes."""
        if not _check_array(w, (types.uint8,)):
            return None

        def codegen(context, builder, sig, args):
            pair = _half_pair(context, builder, sig, args, extra)
            return builder.shuffle_vector(pair, pair, _ivec([0] * 8 + [1] * 8))

        return V16(w, off_a, off_b), codegen

    return intrinsic(typer)


scale_pair = _halves(0)  # block scales d (first two bytes of every GGML block)


@intrinsic
def min16(typingctx, w, off, stride, count):
    """Q4_1 block minimums (f16 at byte 2 of each block) of 16 blocks from byte offset off,
    `stride` bytes apart, as float32 lanes; lanes from `count` on are 0."""
    if not _check_array(w, (types.uint8,)):
        return None

    def codegen(context, builder, sig, args):
        off, stride, count = (_offset(context, builder, sig, args, i) for i in (1, 2, 3))
        out = ir.Constant(_VF, [0.0] * 16)
        for lane in range(16):
            live = builder.icmp_signed("<", ir.Constant(_I64, lane), count)
            k = builder.select(live, ir.Constant(_I64, lane), ir.Constant(_I64, 0))
            o = builder.add(builder.add(off, builder.mul(k, stride)), ir.Constant(_I64, 2))
            raw = _load(builder, _ptr(context, builder, sig.args[0], args[0], o), _I16)
            val = builder.fpext(builder.bitcast(raw, ir.HalfType()), ir.FloatType())
            val = builder.select(live, val, ir.Constant(ir.FloatType(), 0.0))
            out = builder.insert_element(out, val, ir.Constant(_I32, lane))
        return out

    return V16(w, off, stride, count), codegen


def _dpbusd_generic(builder, acc, u, s):
    wide = ir.VectorType(_I32, 64)
    prod = builder.mul(builder.zext(u, wide), builder.sext(s, wide))
    for j in range(4):  # acc + p[4i] + p[4i+1] + p[4i+2] + p[4i+3], lane-wise
        acc = builder.add(acc, builder.shuffle_vector(prod, prod, _ivec(range(j, 64, 4))))
    return acc


def _call(builder, name, ret, *args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), list(args))


def _dpbusd_vnni(builder, acc, u, s):
    return _call(builder, "llvm.x86.avx512.vpdpbusd.512", _VI, acc, u, s)


_MADD = {  # bytes per vpmaddubsw: (its intrinsic, vpmaddwd's)
    32: ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
    64: ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
}


def _madd_sum(builder, u, s, width):
    """<16 x i32>: the sums of four u * s products by vpmaddubsw + vpmaddwd(ones) on `width`
    bytes at a time; exact where no pair sum of vpmaddubsw passes the i16 range."""
    ubsw, wd = _MADD[width]
    words = ir.VectorType(_I16, width // 2)
    ones = ir.Constant(words, [1] * (width // 2))
    parts = []
    for h in range(0, 64, width):  # (64 lanes of 64: a no-op shuffle)
        half = [builder.shuffle_vector(v, v, _ivec(range(h, h + width))) for v in (u, s)]
        pairs = _call(builder, ubsw, words, *half)
        parts.append(_call(builder, wd, ir.VectorType(_I32, width // 4), pairs, ones))
    return parts[0] if len(parts) == 1 else builder.shuffle_vector(*parts, _ivec(range(16)))


def _dpbusd_madd(builder, acc, u, s, width, small):
    if small:  # u < 128: pair sums within +-32512
        return builder.add(acc, _madd_sum(builder, u, s, width))
    low = builder.and_(u, ir.Constant(_VB, [127] * 64))
    high = builder.and_(u, ir.Constant(_VB, [128] * 64))
    acc = builder.add(acc, _madd_sum(builder, low, s, width))
    return builder.add(acc, _madd_sum(builder, high, s, width))


def dpbusd_ir(builder, acc, u, s, variant: str, small: bool):
    """acc + the four-product sums of u (unsigned) and s (signed), spelled for `variant`;
    small: the caller promises u < 128."""
    if variant == "vnni512":
        return _dpbusd_vnni(builder, acc, u, s)
    if variant == "avx512bw":
        return _dpbusd_madd(builder, acc, u, s, 64, small)
    if variant == "avx2":
        return _dpbusd_madd(builder, acc, u, s, 32, small)
    return _dpbusd_generic(builder, acc, u, s)


def _dpbusd(variant, small=False):
    def typer(typingctx, acc, u, s):
        if acc != I16 or u != B64 or s != B64:
            return None

        def codegen(context, builder, sig, args):
            return dpbusd_ir(builder, *args, variant, small)

        return I16(acc, u, s), codegen

    return intrinsic(typer)


dpbusd = _dpbusd(INT8_VARIANT)  # any u
dpbusd_small = _dpbusd(INT8_VARIANT, small=True)  # u < 128 only
# (dpbusd, dpbusd_small) of each variant, for the tests: compile only the target's own or less
VARIANTS = {v: (_dpbusd(v), _dpbusd(v, True)) for v in ("vnni512", "avx512bw", "avx2", "generic")}
dpbusd_vnni, dpbusd_generic = VARIANTS["vnni512"][0], VARIANTS["generic"][0]


@intrinsic
def prefetch(typingctx, arr, off):
    """Hint the cache line holding byte `off` of a uint8 array into every cache level
    (`llvm.prefetch`, read, high locality): a no-op for the results, never faults."""
    if not _check_array(arr, (types.uint8,)):
        return None

    def codegen(context, builder, sig, args):
        ptr = _ptr(context, builder, sig.args[0], args[0], _offset(context, builder, sig, args, 1))
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()

    return types.none(arr, off), codegen


@intrinsic
def itof(typingctx, v):
    """int32 lanes -> float32 lanes (exact below 2**24, which every block sum is)."""
    if v != I16:
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], _VF)

    return V16(v), codegen
