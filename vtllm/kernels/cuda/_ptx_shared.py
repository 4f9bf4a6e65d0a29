"""Shared-memory accesses through inline PTX, on 1-D shared arrays addressed by a
32-bit shared-window address (the array's base converted once, hoisted out of loops, and the
index added in 32 bits: a 64-bit generic pointer converted inside every access costs several
integer instructions and registers per access).

  shared_u32x4(s, i): s[i .. i + 3] of a uint32 shared array in one 128-bit load
      (`ld.shared.v4.u32`); i % 4 == 0. shared_u32x2(s, i): s[i], s[i + 1] in one 64-bit load;
      i % 2 == 0.
  copy_async16_to(s, i, a, row, col): the four uint32 a[row, col .. col + 3] copied to
      s[i .. i + 3] without passing through registers (`cp.async.cg.shared.global`, 16 bytes,
      cached in L2 only); both 16-byte aligned. Completion: _ptx's copy_async_commit and
      copy_async_waiter, then a barrier.
  copy_async16_from(s, i, a, k): the same from a 1-D array, a[k .. k + 3]: a kernel that
      keeps a flat offset per thread and steps it adds to one 64-bit address, where a[row,
      col] recomputes row * stride + col.
  ldmatrix_x4(s, i) / ldmatrix_x4_trans(s, i): four 8 x 8 matrices of 16-bit items, one
      register a matrix (`ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`). Every lane of the
      warp calls it; lane l names, by its i (a word index, 16-byte aligned), the 8 items (16
      bytes) of row l % 8 of matrix l // 8. Lane l = 4 g + t gets from each matrix row g, items
      2t and 2t + 1; with .trans, column g, items 2t and 2t + 1: the B fragment of an mma
      (_ptx.mma_bf16) from a matrix stored row-major by its k index. The lower item is in the
      low half.

For the attention kernels, which move rows of four floats, 128-bit float32 accesses (numba
emits one 32-bit access per element; four of them cost four instructions and four bank passes
where one 128-bit access takes one per eight lanes). The KV cache's 128-bit global loads are
_kv_cache.kv_value4_at.

  shared_f32x4(s, i): s[i .. i + 3] of a 1-D shared array (`ld.shared.v4.f32`); i % 4 == 0.
  store_shared_f32x4(s, i, v0, v1, v2, v3): s[i .. i + 3] = v0 .. v3 (`st.shared.v4.f32`).
  store_f32x4(a, index, v0, v1, v2, v3): a[index] .. (the last index + 3) = v0 .. v3 for a
      float32 array in global memory, index a tuple (i, .., d), d % 4 == 0 and the row start
      16-byte aligned (`st.global.v4.f32`): one address computation and one store, not four.
  (A 64-bit generic pointer per access costs about ten integer instructions per 128-bit load
  in the attention kernels' inner loops.)

All are kept in program order against the other side-effecting PTX (barriers, waits), so a
load never moves above the barrier that publishes what it reads. Under numba's simulator they
are plain indexing (a copy lands at once); ldmatrix there exchanges its lanes' indices through
the block, as _ptx's mma does, so every thread of the block must call it the same number of
times.
"""

import numpy as np

from vtllm.kernels.cuda._device import SIMULATOR

if SIMULATOR:
    from vtllm.kernels.cuda._device import _exchange, _lanes

    def shared_u32x4(s, i):
        return s[i], s[i + 1], s[i + 2], s[i + 3]

    def shared_u32x2(s, i):
        return s[i], s[i + 1]

    def copy_async16_to(s, i, a, row, col):
        for u in range(4):
            s[i + u] = a[row, col + u]

    def copy_async16_from(s, i, a, k):
        for u in range(4):
            s[i + u] = a[k + u]

    def _item16(s, row_at, col):
        return (int(s[row_at + col // 2]) >> (16 * (col % 2))) & 0xFFFF

    def _ldmatrix(s, i, trans):
        tid, _ = _exchange(i)
        base, g, t = tid - tid % 32, (tid % 32) // 4, tid % 4
        regs = []
        for m in range(4):
            rows = _lanes[base + 8 * m : base + 8 * m + 8]
            if trans:
                lo, hi = _item16(s, rows[2 * t], g), _item16(s, rows[2 * t + 1], g)
            else:
                lo, hi = _item16(s, rows[g], 2 * t), _item16(s, rows[g], 2 * t + 1)
            regs.append(np.uint32(lo | (hi << 16)))
        return tuple(regs)

    def ldmatrix_x4(s, i):
        return _ldmatrix(s, i, False)

    def ldmatrix_x4_trans(s, i):
        return _ldmatrix(s, i, True)

else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    from vtllm.kernels.cuda._ptx import _cast_all, _pointer_at

    _I32 = ir.IntType(32)

    def shared_address(context, builder, aryty, ary_value, index_type, index_value):
        """32-bit shared-window address of s[i], s a 1-D shared array of 4-byte items (numba
        hands it around as a generic pointer; the cast back to the shared window is pure, so
        LLVM hoists it out of loops). Taken as an element offset from the base pointer, not
        base + 4 i: the constant part of i then ends up as the load's immediate offset, where
        (i + c) * 4 costs two integer instructions per access, which the attention and GEMM
        inner loops feel."""
        ary = context.make_array(aryty)(context, builder, ary_value)
        shared = builder.addrspacecast(ary.data, ir.PointerType(ary.data.type.pointee, 3))
        i = context.cast(builder, index_value, index_type, types.int64)
        return builder.trunc(builder.ptrtoint(builder.gep(shared, [i]), ir.IntType(64)), _I32)

    def _shared_load(n: int, instruction: str = ""):
        """The codegen of an n-word vector load (`ld.shared.v<n>.u32`, or instruction)."""
        outs = ",".join(f"${k}" for k in range(n))
        text = f"{instruction or f'ld.shared.v{n}.u32'} {{{outs}}}, [${n}];"
        constraints = "=r," * n + "r"

        def codegen(context, builder, sig, args):
            addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            fnty = ir.FunctionType(ir.LiteralStructType([_I32] * n), [_I32])
            res = builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), [addr])
            parts = [builder.extract_value(res, k) for k in range(n)]
            return context.make_tuple(builder, sig.return_type, parts)

        return codegen

    @intrinsic
    def shared_u32x4(typingctx, s, i):
        return types.UniTuple(types.uint32, 4)(s, i), _shared_load(4)

    @intrinsic
    def shared_u32x2(typingctx, s, i):
        return types.UniTuple(types.uint32, 2)(s, i), _shared_load(2)

    _LDMATRIX = "ldmatrix.sync.aligned.m8n8.x4{}.shared.b16"

    @intrinsic
    def ldmatrix_x4(typingctx, s, i):
        return types.UniTuple(types.uint32, 4)(s, i), _shared_load(4, _LDMATRIX.format(""))

    @intrinsic
    def ldmatrix_x4_trans(typingctx, s, i):
        return types.UniTuple(types.uint32, 4)(s, i), _shared_load(4, _LDMATRIX.format(".trans"))

    def _copy_async16(context, builder, sig, args):
        """cp.async of 16 bytes to s[i] (args[:2]) from the item args[2:] names."""
        dst = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        src = _pointer_at(context, builder, sig.args[2:], args[2:])
        fnty = ir.FunctionType(ir.VoidType(), [_I32, src.type])
        text = "cp.async.cg.shared.global [$0], [$1], 16;"
        builder.call(ir.InlineAsm(fnty, text, "r,l,~{memory}", side_effect=True), [dst, src])
        return context.get_dummy_value()

    @intrinsic
    def copy_async16_to(typingctx, s, i, a, row, col):
        return types.void(s, i, a, row, col), _copy_async16

    @intrinsic
    def copy_async16_from(typingctx, s, i, a, k):
        return types.void(s, i, a, k), _copy_async16


# 128-bit float32 accesses: rows of four floats in the attention kernels
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
    _F32 = ir.FloatType()

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
