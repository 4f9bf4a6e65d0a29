"""16-byte loads of packed weight bytes at any byte offset, for block formats whose blocks do
not sit on 16-byte boundaries (Q6_K's 210 bytes, Q3_K's 110, Q5_0's 22, ...).

  chunk_u32x4(a, i): the four little-endian words of the 16-byte aligned chunk that holds byte
      i of a's data (a a 1-D uint8 array; i a flat byte offset), in one 128-bit load
      (`ld.global.nc.L1::no_allocate.v4.u32`: weights are read once, streamed past L1).
  misalign16(a, i): the address of byte i of a's data, mod 16.
  byte_select(a, b, sel): bytes of a (0..3) and b (4..7) picked by the four nibbles of sel,
      the lowest nibble for the lowest byte (`prmt.b32`): one instruction where shifts and
      masks take two or three.
  half_to_f32(h): the float32 of the IEEE half whose bits are the low 16 bits of h, exactly
      (`cvt.f32.f16`, subnormals included).

The chunk holding a byte of the array lies wholly inside the 16-byte aligned span of the
allocation that holds it, so loading it never faults, even where the chunk reaches before the
array's first byte or past its last: _linear_kquant's bytes16 only loads chunks that hold a
byte it needs. Under numba's simulator arrays have no address: the array's start counts as
aligned, and bytes past its end read as zeros.
"""

import numpy as np

from vtllm.kernels.cuda._device import SIMULATOR

if SIMULATOR:

    def chunk_u32x4(a, i):
        base = int(i) - int(i) % 16
        words = [0, 0, 0, 0]
        for j in range(16):
            if base + j < a.shape[0]:
                words[j // 4] |= int(a[base + j]) << (8 * (j % 4))
        return tuple(np.uint32(v) for v in words)

    def misalign16(a, i):
        return np.int32(int(i) % 16)

    def byte_select(a, b, sel):
        both = (int(b) << 32) | int(a)
        return np.uint32(
            sum(((both >> (8 * ((int(sel) >> (4 * k)) & 7))) & 0xFF) << (8 * k) for k in range(4))
        )

    def half_to_f32(h):
        return np.float32(np.uint16(int(h) & 0xFFFF).view(np.float16))

else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    _I32, _I64 = ir.IntType(32), ir.IntType(64)

    def _address(context, builder, sig, args):
        """Integer address of byte args[1] of array args[0]'s data."""
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.int64)
        return builder.add(builder.ptrtoint(ary.data, _I64), i)

    @intrinsic
    def chunk_u32x4(typingctx, a, i):
        sig = types.UniTuple(types.uint32, 4)(a, i)

        def codegen(context, builder, sig, args):
            addr = builder.and_(_address(context, builder, sig, args), ir.Constant(_I64, ~15))
            text = "ld.global.nc.L1::no_allocate.v4.u32 {$0,$1,$2,$3}, [$4];"
            fnty = ir.FunctionType(ir.LiteralStructType([_I32] * 4), [_I64])
            res = builder.call(ir.InlineAsm(fnty, text, "=r,=r,=r,=r,l"), [addr])
            parts = [builder.extract_value(res, n) for n in range(4)]
            return context.make_tuple(builder, sig.return_type, parts)

        return sig, codegen

    @intrinsic
    def misalign16(typingctx, a, i):
        sig = types.int32(a, i)

        def codegen(context, builder, sig, args):
            addr = _address(context, builder, sig, args)
            return builder.trunc(builder.and_(addr, ir.Constant(_I64, 15)), _I32)

        return sig, codegen

    @intrinsic
    def byte_select(typingctx, a, b, sel):
        sig = types.uint32(a, b, sel)

        def codegen(context, builder, sig, args):
            vals = [
                context.cast(builder, v, t, types.uint32)
                for v, t in zip(args, sig.args, strict=True)
            ]
            fnty = ir.FunctionType(_I32, [_I32] * 3)
            asm = ir.InlineAsm(fnty, "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r")
            return builder.call(asm, vals)

        return sig, codegen

    @intrinsic
    def half_to_f32(typingctx, h):
        sig = types.float32(h)

        def codegen(context, builder, sig, args):
            val = context.cast(builder, args[0], sig.args[0], types.uint32)
            text = "{ .reg .b16 lo; cvt.u16.u32 lo, $1; cvt.f32.f16 $0, lo; }"
            fnty = ir.FunctionType(ir.FloatType(), [_I32])
            return builder.call(ir.InlineAsm(fnty, text, "=f,r"), [val])

        return sig, codegen
