"""128-bit float32 shared-memory loads and stores through inline PTX, for kernels that move rows
of four floats (numba emits one 32-bit access per element; four of them cost four instructions
and four bank passes where one 128-bit access takes one per eight lanes). The KV cache's
128-bit global loads are _kv_cache.kv_value4_at.

  shared_f32x4(s, i): s[i .. i + 3] of a 1-D shared array (`ld.shared.v4.f32`); i % 4 == 0.
  store_shared_f32x4(s, i, v0, v1, v2, v3): s[i .. i + 3] = v0 .. v3 (`st.shared.v4.f32`).
  store_f32x4(a, index, v0, v1, v2, v3): a[index] .. (the last index + 3) = v0 .. v3 for a
      float32 array in global memory, index a tuple (i, .., d), d % 4 == 0 and the row start
      16-byte aligned (`st.global.v4.f32`): one address computation and one store, not four.
  The shared accesses address s[i] as a 32-bit shared-window address: the array's base is
  converted once (it does not change in a loop, so the conversion is hoisted) and 4 i added in
  32 bits, where a 64-bit generic pointer per access, converted inside the access, costs
  about ten integer instructions per 128-bit load in the attention kernels' inner loops.

Under numba's simulator they are plain indexing.
"""

from vtllm.kernels.cuda._device import SIMULATOR

if SIMULATOR:

    def shared_f32x4(s, i):
        return s[i], s[i + 1], s[i + 2], s[i + 3]

    def store_shared_f32x4(s, i, v0, v1, v2, v3):
        s[i], s[i + 1], s[i + 2], s[i + 3] = v0, v1, v2, v3

    def store_f32x4(a, index, v0, v1, v2, v3):
        *head, d = index
        for u, v in enumerate((v0, v1, v2, v3)):
            a[(*head, d + u)] = v

else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    from vtllm.kernels.cuda._ptx import _cast_all, _pointer_at
    from vtllm.kernels.cuda._ptx_shared import shared_address

    _F32, _I32 = ir.FloatType(), ir.IntType(32)

    @intrinsic
    def shared_f32x4(typingctx, s, i):
        sig = types.UniTuple(types.float32, 4)(s, i)

        def codegen(context, builder, sig, args):
            addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            text = "ld.shared.v4.f32 {$0,$1,$2,$3}, [$4];"
            # side effects: keeps the load after the barrier that publishes what it reads
            fnty = ir.FunctionType(ir.LiteralStructType([_F32] * 4), [_I32])
            asm = ir.InlineAsm(fnty, text, "=f,=f,=f,=f,r", side_effect=True)
            res = builder.call(asm, [addr])
            parts = [builder.extract_value(res, n) for n in range(4)]
            return context.make_tuple(builder, sig.return_type, parts)

        return sig, codegen

    @intrinsic
    def store_shared_f32x4(typingctx, s, i, v0, v1, v2, v3):
        sig = types.void(s, i, v0, v1, v2, v3)

        def codegen(context, builder, sig, args):
            addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            vals = _cast_all(context, builder, args[2:], sig.args[2:], types.float32)
            text = "st.shared.v4.f32 [$0], {$1,$2,$3,$4};"
            fnty = ir.FunctionType(ir.VoidType(), [_I32] + [_F32] * 4)
            builder.call(ir.InlineAsm(fnty, text, "r,f,f,f,f", side_effect=True), [addr] + vals)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def store_f32x4(typingctx, a, index, v0, v1, v2, v3):
        if not isinstance(index, types.BaseTuple) or len(index) != a.ndim:
            return None
        sig = types.void(a, index, v0, v1, v2, v3)

        def codegen(context, builder, sig, args):
            parts = [builder.extract_value(args[1], n) for n in range(len(sig.args[1]))]
            ptr = _pointer_at(context, builder, (sig.args[0], *sig.args[1]), [args[0], *parts])
            vals = _cast_all(context, builder, args[2:], sig.args[2:], types.float32)
            text = "st.global.v4.f32 [$0], {$1,$2,$3,$4};"
            fnty = ir.FunctionType(ir.VoidType(), [ptr.type] + [_F32] * 4)
            builder.call(
                ir.InlineAsm(fnty, text, "l,f,f,f,f,~{memory}", side_effect=True), [ptr] + vals
            )
            return context.get_dummy_value()

        return sig, codegen
