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
  kv_copy4_async(c, at, s, i, live): items at .. at + 3 of c (flat offset, as kv_value4_at)
      copied as they are stored to the uint32 shared array s from word i on, without passing
      through registers (`cp.async`: 16 bytes for float32, cached in L2 only; 8 bytes for
      bf16); live False reads nothing and zero-fills (no branch around the copy); completion
      as for _ptx_shared.copy_async16_to.
  kv_words4(c): the words such a copy fills (4 or 2), a constant of the kernel.
  kv_shared4(c, s, i): the four float32 values of a kv_copy4_async copy at s[i ..].
  kv_copy8_async(c, at, s, i, live) and kv_shared8(c, s, i): the same for eight items of a
      bf16 cache (uint16 only): one 16-byte `cp.async.cg` to s[i .. i + 3] (at a multiple
      of 8, i of 4) and one `ld.shared.v4.u32` back, eight float32 in item order; half the
      copies and shared loads of kv_copy4_async's 8-byte ones for the same bytes.

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

    def kv_words4(c):
        return 2 if c.dtype == np.uint16 else 4

    def kv_copy4_async(c, at, s, i, live):
        items = np.zeros(4, c.dtype)
        if live:
            items = np.array([c[np.unravel_index(at + u, c.shape)] for u in range(4)], c.dtype)
        for u, word in enumerate(items.view(np.uint32)):
            s[i + u] = word

    def kv_shared4(c, s, i):
        words = np.array([s[i + u] for u in range(kv_words4(c))], np.uint32)
        if c.dtype == np.uint16:
            return tuple(_bf16_value(b) for b in words.view(np.uint16))
        return tuple(words.view(np.float32))

    def kv_copy8_async(c, at, s, i, live):
        assert c.dtype == np.uint16 and at % 8 == 0 and i % 4 == 0
        items = np.zeros(8, c.dtype)
        if live:
            items = np.array([c[np.unravel_index(at + u, c.shape)] for u in range(8)], c.dtype)
        for u, word in enumerate(items.view(np.uint32)):
            s[i + u] = word

    def kv_shared8(c, s, i):
        words = np.array([s[i + u] for u in range(4)], np.uint32)
        return tuple(_bf16_value(b) for b in words.view(np.uint16))

else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    from vtllm.kernels.cuda._ptx import _asm_tuple, _cast_all, _pointer_at
    from vtllm.kernels.cuda._ptx_shared import shared_address

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

    @intrinsic
    def kv_words4(typingctx, c):
        if c.dtype not in _STORAGE:
            return None

        def codegen(context, builder, sig, args):
            return ir.Constant(_I32, 4 if sig.args[0].dtype == types.float32 else 2)

        return types.int32(c), codegen

    @intrinsic
    def kv_copy4_async(typingctx, c, at, s, i, live):
        if c.dtype not in _STORAGE or not isinstance(at, types.Integer):
            return None
        sig = types.void(c, at, s, i, live)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            src = builder.gep(ary.data, [context.cast(builder, args[1], sig.args[1], types.int64)])
            dst = shared_address(context, builder, sig.args[2], args[2], sig.args[3], args[3])
            n = 16 if sig.args[0].dtype == types.float32 else 8
            live = context.cast(builder, args[4], sig.args[4], types.boolean)
            src_bytes = builder.select(live, ir.Constant(_I32, n), ir.Constant(_I32, 0))
            level = "cg" if n == 16 else "ca"  # .cg takes 16 bytes only
            text = f"cp.async.{level}.shared.global [$0], [$1], {n}, $2;"
            fnty = ir.FunctionType(ir.VoidType(), [_I32, src.type, _I32])
            asm = ir.InlineAsm(fnty, text, "r,l,r,~{memory}", side_effect=True)
            builder.call(asm, [dst, src, src_bytes])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def kv_shared4(typingctx, c, s, i):
        if c.dtype not in _STORAGE:
            return None
        sig = types.UniTuple(types.float32, 4)(c, s, i)

        def codegen(context, builder, sig, args):
            addr = shared_address(context, builder, sig.args[1], args[1], sig.args[2], args[2])
            n = 4 if sig.args[0].dtype == types.float32 else 2
            outs = ",".join(f"${k}" for k in range(n))
            fnty = ir.FunctionType(ir.LiteralStructType([_I32] * n), [_I32])
            # a side effect: kept after the wait and barrier that publish the copy
            asm = ir.InlineAsm(
                fnty, f"ld.shared.v{n}.u32 {{{outs}}}, [${n}];", "=r," * n + "r", side_effect=True
            )
            res = builder.call(asm, [addr])
            words = [builder.extract_value(res, k) for k in range(n)]
            if n == 4:
                parts = [builder.bitcast(w, _F32) for w in words]
            else:
                parts = [*_bf16_pair(builder, words[0]), *_bf16_pair(builder, words[1])]
            return context.make_tuple(builder, sig.return_type, parts)

        return sig, codegen

    @intrinsic
    def kv_copy8_async(typingctx, c, at, s, i, live):
        if c.dtype != types.uint16 or not isinstance(at, types.Integer):
            return None
        sig = types.void(c, at, s, i, live)

        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            src = builder.gep(ary.data, [context.cast(builder, args[1], sig.args[1], types.int64)])
            dst = shared_address(context, builder, sig.args[2], args[2], sig.args[3], args[3])
            live = context.cast(builder, args[4], sig.args[4], types.boolean)
            src_bytes = builder.select(live, ir.Constant(_I32, 16), ir.Constant(_I32, 0))
            text = "cp.async.cg.shared.global [$0], [$1], 16, $2;"
            fnty = ir.FunctionType(ir.VoidType(), [_I32, src.type, _I32])
            asm = ir.InlineAsm(fnty, text, "r,l,r,~{memory}", side_effect=True)
            builder.call(asm, [dst, src, src_bytes])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def kv_shared8(typingctx, c, s, i):
        if c.dtype != types.uint16:
            return None
        sig = types.UniTuple(types.float32, 8)(c, s, i)

        def codegen(context, builder, sig, args):
            addr = shared_address(context, builder, sig.args[1], args[1], sig.args[2], args[2])
            fnty = ir.FunctionType(ir.LiteralStructType([_I32] * 4), [_I32])
            # a side effect: kept after the wait and barrier that publish the copy
            text = "ld.shared.v4.u32 {$0,$1,$2,$3}, [$4];"
            asm = ir.InlineAsm(fnty, text, "=r,=r,=r,=r,r", side_effect=True)
            res = builder.call(asm, [addr])
            parts = []
            for k in range(4):
                parts += _bf16_pair(builder, builder.extract_value(res, k))
            return context.make_tuple(builder, sig.return_type, parts)

        return sig, codegen
