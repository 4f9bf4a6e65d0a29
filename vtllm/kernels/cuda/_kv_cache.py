"""Reads and writes of the paged KV cache in either of its storage types, chosen by the cache
array's dtype when a kernel is compiled (no branch at run time):

  float32: the values themselves;
  uint16:  bf16 bit patterns (the "bfloat16" KV cache: half the bytes, what vLLM and llama.cpp
           store for 16-bit models); values are rounded to nearest even on the way in and are
           exact float32 on the way out, so the kernels' math after the load is unchanged.

  kv_value(c, i, j, k, d): c[i, j, k, d] as float32.
  kv_value4_at(c, at): c[i, j, k, d .. d + 3] as four float32 in one load (128-bit for
      float32, 64-bit for bf16, `ld.global.nc`: the cache is not written while a kernel reads
      it), given as the flat item offset at = ((i * c.shape[1] + j) * c.shape[2] + k) *
      c.shape[3] + d, aligned to the load's size: a kernel that reads K and V of one slot
      works the offset out once, where each 4-D index costs a chain of 64-bit multiplies.
  kv_store(c, i, j, k, d, x): c[i, j, k, d] = x (rounded to bf16 for a uint16 cache,
      `cvt.rn.bf16.f32`).
  kv_rounded(c, x): the float32 that kv_value reads back after kv_store(c, .., x).

Under numba's simulator they are plain indexing with the same conversions.
"""

import numpy as np

from vtllm.kernels.cuda._device import SIMULATOR
from vtllm.kernels.cuda._host import check

KV_DTYPES = {"float32": np.float32, "bfloat16": np.uint16}  # storage type: cache array dtype


def check_kv(op: str, k_cache, v_cache) -> None:
    """ValueError unless k_cache and v_cache are C-contiguous 4-D device arrays of one shape
    and one of the KV storage dtypes."""
    dtype = getattr(k_cache, "dtype", None)
    if dtype is not None and dtype not in KV_DTYPES.values():
        raise ValueError(f"{op}: k_cache must be float32 or uint16 (bf16 bits), got {dtype}")
    check(op, "k_cache", k_cache, dtype, 4)
    check(op, "v_cache", v_cache, dtype, 4, k_cache.shape)


if SIMULATOR:

    def _bf16_value(bits):
        return np.uint32(int(bits) << 16).view(np.float32)

    def _round_bf16(x):
        bits = int(np.float32(x).view(np.uint32))
        return np.uint16(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF)

    def kv_value(c, i, j, k, d):
        x = c[i, j, k, d]
        return _bf16_value(x) if c.dtype == np.uint16 else np.float32(x)

    def kv_value4_at(c, at):
        i, j, k, d = np.unravel_index(at, c.shape)
        return tuple(kv_value(c, i, j, k, d + u) for u in range(4))

    def kv_store(c, i, j, k, d, x):
        c[i, j, k, d] = _round_bf16(x) if c.dtype == np.uint16 else x

    def kv_rounded(c, x):
        return _bf16_value(_round_bf16(x)) if c.dtype == np.uint16 else np.float32(x)

else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    from vtllm.kernels.cuda._ptx import _asm_tuple, _cast_all, _pointer_at

    _F32, _I16, _I32 = ir.FloatType(), ir.IntType(16), ir.IntType(32)
    _STORAGE = (types.float32, types.uint16)

    def _bf16_pair(builder, word):
        """The two float32 of a 32-bit word of bf16 bits (the lower index in the low half)."""
        low = builder.shl(word, ir.Constant(_I32, 16))
        high = builder.and_(word, ir.Constant(_I32, 0xFFFF0000))
        return builder.bitcast(low, _F32), builder.bitcast(high, _F32)

    @intrinsic
    def kv_value(typingctx, c, i, j, k, d):
        if c.dtype not in _STORAGE:
            return None
        sig = types.float32(c, i, j, k, d)

        def codegen(context, builder, sig, args):
            value = builder.load(_pointer_at(context, builder, sig.args, args))
            if sig.args[0].dtype == types.float32:
                return value
            return _bf16_pair(builder, builder.zext(value, _I32))[0]

        return sig, codegen

    @intrinsic
    def kv_value4_at(typingctx, c, at):
        if c.dtype not in _STORAGE or not isinstance(at, types.Integer):
            return None
        sig = types.UniTuple(types.float32, 4)(c, at)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            at = context.cast(builder, args[1], sig.args[1], types.int64)
            ptr = builder.gep(ary.data, [at])
            if sig.args[0].dtype == types.float32:
                text = "ld.global.nc.v4.f32 {$0,$1,$2,$3}, [$4];"
                constraints = "=f,=f,=f,=f,l"
                return _asm_tuple(context, builder, sig, text, constraints, _F32, [ptr.type], [ptr])
            fnty = ir.FunctionType(ir.LiteralStructType([_I32] * 2), [ptr.type])
            asm = ir.InlineAsm(fnty, "ld.global.nc.v2.b32 {$0,$1}, [$2];", "=r,=r,l")
            words = builder.call(asm, [ptr])
            parts = [*_bf16_pair(builder, builder.extract_value(words, 0))]
            parts += _bf16_pair(builder, builder.extract_value(words, 1))
            return context.make_tuple(builder, sig.return_type, parts)

        return sig, codegen

    @intrinsic
    def kv_store(typingctx, c, i, j, k, d, x):
        if c.dtype not in _STORAGE:
            return None
        sig = types.void(c, i, j, k, d, x)

        def codegen(context, builder, sig, args):
            ptr = _pointer_at(context, builder, sig.args[:5], args[:5])
            (value,) = _cast_all(context, builder, args[5:], sig.args[5:], types.float32)
            if sig.args[0].dtype == types.uint16:
                fnty = ir.FunctionType(_I16, [_F32])
                value = builder.call(ir.InlineAsm(fnty, "cvt.rn.bf16.f32 $0, $1;", "=h,f"), [value])
            builder.store(value, ptr)
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def kv_rounded(typingctx, c, x):
        if c.dtype not in _STORAGE:
            return None
        sig = types.float32(c, x)

        def codegen(context, builder, sig, args):
            (value,) = _cast_all(context, builder, args[1:], sig.args[1:], types.float32)
            if sig.args[0].dtype == types.float32:
                return value
            fnty = ir.FunctionType(_I16, [_F32])
            bits = builder.call(ir.InlineAsm(fnty, "cvt.rn.bf16.f32 $0, $1;", "=h,f"), [value])
            return _bf16_pair(builder, builder.zext(bits, _I32))[0]

        return sig, codegen
