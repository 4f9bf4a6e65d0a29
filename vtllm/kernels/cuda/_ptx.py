"""Inline-PTX intrinsics for the tensor-core kernels, and their stand-ins under the simulator.

  load_u32x4(a, row, col): the four uint32 a[row, col .. col + 3] in one 128-bit load,
      `ld.global.nc.L1::no_allocate.v4.u32` (read-only data streamed past L1: weights); col
      must be a multiple of 4 and the row start 16-byte aligned. load_u32x2(a, row, col): the
      two a[row, col], a[row, col + 1] the same way in one 64-bit load; col even.
  mma_bf16(a0..a3, b0, b1, c0..c3): one warp-wide `mma.sync.aligned.m16n8k16.row.col` with
      bf16 inputs and float32 accumulators, D = A @ B + C. Fragments as in the PTX ISA: with
      g = lane // 4 and t = lane % 4, register a0 holds A[g, 2t .. 2t+1], a1 A[g+8, 2t ..],
      a2 A[g, 2t+8 ..], a3 A[g+8, 2t+8 ..]; b0 B[2t .. 2t+1, g], b1 B[2t+8 .., g]; c0/c1
      C[g, 2t], C[g, 2t+1], c2/c3 the same at row g+8. Each 32-bit register packs two bf16,
      the lower index in the low half. Every lane of the warp must call it together.
  split_bf16x2(u, v): (hi, lo), two uint32 of bf16 pairs, u in the low halves: hi rounds u and
      v to bf16 (nearest even), lo rounds the remainders u - hi, v - hi, so u ~ hi + lo to
      about 2^-17 relative (`cvt.rn.bf16x2.f32` twice, two subtractions).
  exp2_approx(x): 2^x in float32 (`ex2.approx.ftz.f32`: 2 ulp, subnormals to zero; 2^-inf = 0),
      one MUFU instruction where libdevice's exp2f adds range checks around it.
  pack_bf16x2(u, v): u and v rounded to bf16 (nearest even) in one uint32, u in the low half:
      split_bf16x2's hi alone (one `cvt.rn.bf16x2.f32`).
  load_f32x2(a, row, col): a[row, col] and a[row, col + 1] in one 64-bit load; col even and
      the row start 8-byte aligned.
  item_at(a, i): the item at flat offset i of a C-contiguous array: no negative-index fix-up
      and no chain of 64-bit multiplies (numba's indexing does both, per index), for a
      kernel that works out a row's offset once.
  prefetch_l1(a, row, col): brings the line of a[row, col] into L1 (`prefetch.global.L1`), so
      that a later load of it (one that waits on other work first) hits there.
  copy_async_commit(): closes the group of this thread's cp.async copies (_ptx_shared's
      copy_async16_to) issued since the last commit (`cp.async.commit_group`);
      copy_async_waiter(n) makes a function that waits until at most n of this thread's groups
      are still in flight (`cp.async.wait_group n`). Other threads see the data only after a
      barrier that follows the wait.
  e4m3x4_to_bf16x4(w): the four e4m3fn codes of uint32 w (code i in byte i) as two uint32
      of bf16 pairs (codes 0, 1 and codes 2, 3, the first of each in the low half): exact, for
      every code but the NaN ones (e4m3's 3-bit mantissa and 4-bit exponent fit bf16, subnormals
      included). Code S.EEEE.MMM goes to float32 bits S.0000EEEE.MMM0.., which is the code's
      value times 2^-120 (a float32 subnormal where E = 0, as e4m3's own subnormals scale), then
      one `mul.rn.f32` by 2^120 (subnormal inputs are exact without .ftz) and the upper halves
      of two results make a bf16 pair. The FP8 weights of _linear_mma, _linear_rows and
      _gemm_mma go through it to become mma A fragments.
  load_u32(a, row, col): the uint32 a[row, col] by the same streaming load, 32 bits.
  codes4_bf16x4(w, neg): eight 4-bit codes of uint32 w as four uint32 of bf16 pairs (register
      r's halves: the nibbles at bits 4 r and 16 + 4 r), each code u becoming u - o exactly,
      where neg is the bf16 pair (-128 - o, -128 - o): register r is
      ((w >> 4 r) & 0x000F000F) | 0x43004300 (bf16 128 + u, u < 128) and one `fma.rn.bf16x2`
      by 1.0 adds neg (a small integer result: exact). codes8_bf16x4(w0, w1, neg): the same
      for eight byte codes (below 128) in FP8's order (byte 2 r + h of w0, w1: register r's
      half h), `prmt` placing each byte under 0x43. The K-quant weights of _linear_mma,
      _linear_rows and _gemm_mma become A fragments through them (_kquant_pack).
  mul_rn(a, b): float32 a * b rounded once and never fused with a later add into an fma
      (`mul.rn.f32`: an explicit rounding mode keeps the optimizer's hands off), so that an FP8
      row's scale times its sum gives the same bits in every kernel whatever follows it.

  grid_dependency_sync(): the first statement of every kernel. A kernel replayed in a CUDA
      graph whose kernel-to-kernel edges are programmatic (executor/cuda_graphs) is launched
      as the blocks of the kernel before it exit, before that kernel has completed; this
      waits until it has and its writes are visible (`griddepcontrol.wait`). Outside such a
      graph it returns at once. No kernel signals its dependents early
      (`griddepcontrol.launch_dependents`): blocks launched early only to wait take SM room
      from the running kernel, which slows decode down (BENCHMARKS.md, GPU decode and
      prefill). The instruction needs sm_90: GRID_DEPENDENCY says whether the kernels carry
      it (not on older GPUs, nor in the simulator), and only then may a graph's edges be
      programmatic.

numba's simulator has no inline PTX: there the loads are plain indexing and the mma is
computed in float64 from the whole warp's fragments, exchanged through the block like the
simulator's warp reductions (so every thread of a block must call it the same number of
times: keep calls in block-uniform control flow).

Over 400 lines: each intrinsic's PTX sits beside its simulator stand-in, which must give the
same values, and the two change together.
"""

import numpy as np

from vtllm.kernels.cuda._device import SIMULATOR

if SIMULATOR:
    from vtllm.kernels.cuda._device import _exchange, _lanes

    GRID_DEPENDENCY = False

    def grid_dependency_sync():
        pass

    def load_u32x4(a, row, col):
        return a[row, col], a[row, col + 1], a[row, col + 2], a[row, col + 3]

    def load_f32x2(a, row, col):
        return a[row, col], a[row, col + 1]

    load_u32x2 = load_f32x2

    def item_at(a, i):
        return a[np.unravel_index(i, a.shape)]

    def prefetch_l1(a, row, col):
        pass

    def copy_async_commit():
        pass

    def copy_async_waiter(n):
        def wait():
            pass

        return wait

    def _round_bf16(x) -> int:
        """bf16 bits of float32 x, round to nearest even (finite x)."""
        bits = int(np.float32(x).view(np.uint32))
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF

    def split_bf16x2(u, v):
        hu, hv = _round_bf16(u), _round_bf16(v)
        lu = _round_bf16(np.float32(u) - np.uint32(hu << 16).view(np.float32))
        lv = _round_bf16(np.float32(v) - np.uint32(hv << 16).view(np.float32))
        return hu | (hv << 16), lu | (lv << 16)

    def exp2_approx(x):
        return np.float32(np.exp2(np.float64(x)))

    def pack_bf16x2(u, v):
        return _round_bf16(u) | (_round_bf16(v) << 16)

    def _bf16(bits) -> float:
        return float(np.uint32((int(bits) & 0xFFFF) << 16).view(np.float32))

    def _e4m3_bf16_table() -> np.ndarray:
        """bf16 bits of each e4m3 code by e4m3x4_to_bf16x4's own steps, in numpy."""
        code = np.arange(256, dtype=np.uint32)
        bits = ((code & 0x80) << 24) | ((code & 0x7F) << 20)
        value = bits.view(np.float32) * np.float32(2.0**120)
        return (value.view(np.uint32) >> 16).astype(np.int64)

    _E4M3_BF16 = [int(b) for b in _e4m3_bf16_table()]

    def e4m3x4_to_bf16x4(w):
        w, t = int(w), _E4M3_BF16
        lo = t[w & 0xFF] | (t[(w >> 8) & 0xFF] << 16)
        hi = t[(w >> 16) & 0xFF] | (t[(w >> 24) & 0xFF] << 16)
        return np.uint32(lo), np.uint32(hi)

    def load_u32(a, row, col):
        return a[row, col]

    def _codes_bf16(codes, neg):
        """bf16 pairs of 128 + code + neg's value, per register (exact small integers)."""
        off = 128.0 + _bf16(int(neg) & 0xFFFF)
        regs = [
            _round_bf16(codes[2 * r] + off) | (_round_bf16(codes[2 * r + 1] + off) << 16)
            for r in range(4)
        ]
        return tuple(np.uint32(v) for v in regs)

    def codes4_bf16x4(w, neg):
        w = int(w)
        return _codes_bf16([(w >> (4 * (i // 2) + 16 * (i % 2))) & 15 for i in range(8)], neg)

    def codes8_bf16x4(w0, w1, neg):
        b = int(w0) | (int(w1) << 32)
        return _codes_bf16([(b >> (8 * i)) & 0xFF for i in range(8)], neg)

    def mul_rn(a, b):
        return np.float32(np.float32(a) * np.float32(b))

    def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        tid, _ = _exchange((a0, a1, a2, a3, b0, b1))
        base = tid - tid % 32
        A = np.zeros((16, 16))
        B = np.zeros((16, 8))
        for lane in range(32):
            g, t = lane // 4, lane % 4
            ra0, ra1, ra2, ra3, rb0, rb1 = _lanes[base + lane]
            for half in range(2):
                shift = 16 * half
                A[g, 2 * t + half] = _bf16(int(ra0) >> shift)
                A[g + 8, 2 * t + half] = _bf16(int(ra1) >> shift)
                A[g, 2 * t + 8 + half] = _bf16(int(ra2) >> shift)
                A[g + 8, 2 * t + 8 + half] = _bf16(int(ra3) >> shift)
                B[2 * t + half, g] = _bf16(int(rb0) >> shift)
                B[2 * t + 8 + half, g] = _bf16(int(rb1) >> shift)
        D = A @ B
        g, t = (tid % 32) // 4, tid % 4
        f = np.float32
        return (
            f(D[g, 2 * t] + c0),
            f(D[g, 2 * t + 1] + c1),
            f(D[g + 8, 2 * t] + c2),
            f(D[g + 8, 2 * t + 1] + c3),
        )

else:
    from llvmlite import ir
    from numba import cuda
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    _I32, _F32 = ir.IntType(32), ir.FloatType()

    def _sm90_or_later() -> bool:
        """Whether the GPU runs griddepcontrol; with none visible (an offline compile for
        sm_90, tools/kernel_report.py), assume it does."""
        if not cuda.is_available():
            return True
        return cuda.get_current_device().compute_capability >= (9, 0)

    GRID_DEPENDENCY = _sm90_or_later()

    def _item_pointer(context, builder, sig, args):
        """Address of a[row, col] for an intrinsic called as f(a, row, col)."""
        return _pointer_at(context, builder, sig.args, args)

    def _pointer_at(context, builder, tys, values):
        """Address of a[i, j, ..] from the types and values of (a, i, j, ..)."""
        aryty = tys[0]
        ary = context.make_array(aryty)(context, builder, values[0])
        idx = _cast_all(context, builder, values[1:], tys[1:], types.intp)
        return cgutils.get_item_pointer(context, builder, aryty, ary, idx, wraparound=False)

    def _cast_all(context, builder, values, from_types, to):
        return [context.cast(builder, v, t, to) for v, t in zip(values, from_types, strict=True)]

    def _asm_tuple(context, builder, sig, text, constraints, out, in_types, values):
        """Calls inline PTX returning len(sig.return_type) values of LLVM type out, as the
        intrinsic's tuple."""
        n = len(sig.return_type)
        fnty = ir.FunctionType(ir.LiteralStructType([out] * n), in_types)
        res = builder.call(ir.InlineAsm(fnty, text, constraints), values)
        parts = [builder.extract_value(res, i) for i in range(n)]
        return context.make_tuple(builder, sig.return_type, parts)

    def _global_load(instruction: str, n: int, of, llvm_type, register: str):
        """An intrinsic f(a, row, col) -> the n values of numba type `of` at a[row, col ..]
        in one vector load, `instruction {$0, ..}, [$n];` (register: their constraint letter)."""
        outs = ",".join(f"${i}" for i in range(n))
        text = f"{instruction} {{{outs}}}, [${n}];"
        constraints = ",".join([f"={register}"] * n + ["l"])

        @intrinsic
        def load(typingctx, a, row, col):
            sig = types.UniTuple(of, n)(a, row, col)

            def codegen(context, builder, sig, args):
                ptr = _item_pointer(context, builder, sig, args)
                return _asm_tuple(
                    context, builder, sig, text, constraints, llvm_type, [ptr.type], [ptr]
                )

            return sig, codegen

        return load

    load_u32x4 = _global_load("ld.global.nc.L1::no_allocate.v4.u32", 4, types.uint32, _I32, "r")
    load_u32x2 = _global_load("ld.global.nc.L1::no_allocate.v2.u32", 2, types.uint32, _I32, "r")
    load_f32x2 = _global_load("ld.global.v2.f32", 2, types.float32, _F32, "f")

    def _asm_void(builder, text, constraints, in_types, values):
        """Inline PTX with no result, kept in place (side effects) and ordered against memory."""
        fnty = ir.FunctionType(ir.VoidType(), in_types)
        asm = ir.InlineAsm(
            fnty, text, constraints + ("," if constraints else "") + "~{memory}", side_effect=True
        )
        builder.call(asm, values)

    def _statement(text: str | None):
        """An intrinsic f() running the PTX statement text (None: nothing at all)."""

        @intrinsic
        def statement(typingctx):
            sig = types.void()

            def codegen(context, builder, sig, args):
                if text is not None:
                    _asm_void(builder, text, "", [], [])
                return context.get_dummy_value()

            return sig, codegen

        return statement

    @intrinsic
    def item_at(typingctx, a, i):
        if not isinstance(i, types.Integer):
            return None
        sig = a.dtype(a, i)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            at = context.cast(builder, args[1], sig.args[1], types.int64)
            return builder.load(builder.gep(ary.data, [at]))

        return sig, codegen

    @intrinsic
    def prefetch_l1(typingctx, a, row, col):
        sig = types.void(a, row, col)

        def codegen(context, builder, sig, args):
            ptr = _item_pointer(context, builder, sig, args)
            _asm_void(builder, "prefetch.global.L1 [$0];", "l", [ptr.type], [ptr])
            return context.get_dummy_value()

        return sig, codegen

    copy_async_commit = _statement("cp.async.commit_group;")

    def copy_async_waiter(n: int):
        return _statement(f"cp.async.wait_group {int(n)};")

    grid_dependency_sync = _statement("griddepcontrol.wait;" if GRID_DEPENDENCY else None)

    @intrinsic
    def mma_bf16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        sig = types.UniTuple(types.float32, 4)(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

        def codegen(context, builder, sig, args):
            regs = _cast_all(context, builder, args[:6], sig.args[:6], types.uint32)
            accs = _cast_all(context, builder, args[6:], sig.args[6:], types.float32)
            text = (
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};"
            )
            constraints = "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f"
            in_types = [_I32] * 6 + [_F32] * 4
            return _asm_tuple(context, builder, sig, text, constraints, _F32, in_types, regs + accs)

        return sig, codegen

    @intrinsic
    def split_bf16x2(typingctx, u, v):
        sig = types.UniTuple(types.uint32, 2)(u, v)

        def codegen(context, builder, sig, args):
            vals = _cast_all(context, builder, args, sig.args, types.float32)
            text = (
                "{ .reg .b32 lo_b, hi_b; .reg .f32 lo_f, hi_f;"
                " cvt.rn.bf16x2.f32 $0, $3, $2;"
                " shl.b32 lo_b, $0, 16; and.b32 hi_b, $0, 0xFFFF0000;"
                " mov.b32 lo_f, lo_b; mov.b32 hi_f, hi_b;"
                " sub.f32 lo_f, $2, lo_f; sub.f32 hi_f, $3, hi_f;"
                " cvt.rn.bf16x2.f32 $1, hi_f, lo_f; }"
            )
            return _asm_tuple(context, builder, sig, text, "=&r,=r,f,f", _I32, [_F32] * 2, vals)

        return sig, codegen

    @intrinsic
    def pack_bf16x2(typingctx, u, v):
        sig = types.uint32(u, v)

        def codegen(context, builder, sig, args):
            vals = _cast_all(context, builder, args, sig.args, types.float32)
            fnty = ir.FunctionType(_I32, [_F32] * 2)
            asm = ir.InlineAsm(fnty, "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f")
            return builder.call(asm, vals)

        return sig, codegen

    @intrinsic
    def exp2_approx(typingctx, x):
        sig = types.float32(x)

        def codegen(context, builder, sig, args):
            val = context.cast(builder, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(_F32, [_F32]), "ex2.approx.ftz.f32 $0, $1;", "=f,f")
            return builder.call(asm, [val])

        return sig, codegen

    def _e4m3_steps() -> str:
        """PTX of e4m3x4_to_bf16x4 ($0, $1 out, $2 in): code i of $2 to float32 bits
        S.0000EEEE.MMM0.. (sign to bit 31, the other seven bits to 26 .. 20), times 2^120, then
        the upper halves of two floats in one register (prmt)."""
        lines = ["{ .reg .b32 s, m; .reg .f32 f0, f1, f2, f3;"]
        for i in range(4):
            sign = f"shl.b32 s, $2, {24 - 8 * i};" if i < 3 else "mov.b32 s, $2;"
            mag = f"shl.b32 m, $2, {20 - 8 * i};" if i < 3 else "shr.b32 m, $2, 4;"
            lines += [
                sign,
                mag,
                "and.b32 s, s, 0x80000000;",
                "and.b32 m, m, 0x07F00000;",
                "or.b32 s, s, m;",
                f"mov.b32 f{i}, s;",
                f"mul.rn.f32 f{i}, f{i}, 0f7B800000;",
            ]
        lines += ["prmt.b32 $0, f0, f1, 0x7632;", "prmt.b32 $1, f2, f3, 0x7632; }"]
        return " ".join(lines)

    _E4M3_PTX = _e4m3_steps()

    @intrinsic
    def e4m3x4_to_bf16x4(typingctx, w):
        sig = types.UniTuple(types.uint32, 2)(w)

        def codegen(context, builder, sig, args):
            vals = _cast_all(context, builder, args, sig.args, types.uint32)
            return _asm_tuple(context, builder, sig, _E4M3_PTX, "=r,=r,r", _I32, [_I32], vals)

        return sig, codegen

    @intrinsic
    def mul_rn(typingctx, a, b):
        sig = types.float32(a, b)

        def codegen(context, builder, sig, args):
            vals = _cast_all(context, builder, args, sig.args, types.float32)
            fnty = ir.FunctionType(_F32, [_F32] * 2)
            return builder.call(ir.InlineAsm(fnty, "mul.rn.f32 $0, $1, $2;", "=f,f,f"), vals)

        return sig, codegen

    @intrinsic
    def load_u32(typingctx, a, row, col):
        sig = types.uint32(a, row, col)

        def codegen(context, builder, sig, args):
            ptr = _item_pointer(context, builder, sig, args)
            fnty = ir.FunctionType(_I32, [ptr.type])
            text = "ld.global.nc.L1::no_allocate.u32 $0, [$1];"
            return builder.call(ir.InlineAsm(fnty, text, "=r,l"), [ptr])

        return sig, codegen

    _ONE_BF16X2 = "0x3F803F80"

    def _codes4_steps() -> str:
        """PTX of codes4_bf16x4 ($0 .. $3 out, $4 the codes, $5 neg)."""
        lines = [f"{{ .reg .b32 t, one; mov.b32 one, {_ONE_BF16X2};"]
        for r in range(4):
            lines += [
                f"shr.b32 t, $4, {4 * r};",
                "and.b32 t, t, 0x000F000F;",
                "or.b32 t, t, 0x43004300;",
                f"fma.rn.bf16x2 ${r}, t, one, $5;",
            ]
        return " ".join(lines) + " }"

    def _codes8_steps() -> str:
        """PTX of codes8_bf16x4 ($0 .. $3 out, $4 $5 the codes, $6 neg)."""
        lines = [f"{{ .reg .b32 t, c, one; mov.b32 c, 0x43; mov.b32 one, {_ONE_BF16X2};"]
        for r in range(4):
            lines += [
                f"prmt.b32 t, ${4 + r // 2}, c, {'0x4140' if r % 2 == 0 else '0x4342'};",
                f"fma.rn.bf16x2 ${r}, t, one, $6;",
            ]
        return " ".join(lines) + " }"

    _CODES4_PTX, _CODES8_PTX = _codes4_steps(), _codes8_steps()

    @intrinsic
    def codes4_bf16x4(typingctx, w, neg):
        sig = types.UniTuple(types.uint32, 4)(w, neg)

        def codegen(context, builder, sig, args):
            vals = _cast_all(context, builder, args, sig.args, types.uint32)
            constraints = "=r,=r,=r,=r,r,r"
            return _asm_tuple(
                context, builder, sig, _CODES4_PTX, constraints, _I32, [_I32] * 2, vals
            )

        return sig, codegen

    @intrinsic
    def codes8_bf16x4(typingctx, w0, w1, neg):
        sig = types.UniTuple(types.uint32, 4)(w0, w1, neg)

        def codegen(context, builder, sig, args):
            vals = _cast_all(context, builder, args, sig.args, types.uint32)
            constraints = "=r,=r,=r,=r,r,r,r"
            return _asm_tuple(
                context, builder, sig, _CODES8_PTX, constraints, _I32, [_I32] * 3, vals
            )

        return sig, codegen
