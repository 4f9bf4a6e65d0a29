"""Hopper's warpgroup tensor-core instructions (`wgmma`, sm_90a) for the prefill GEMM.

A warpgroup is 4 consecutive warps (128 threads, the first warp's index a multiple of 4). One
`wgmma.mma_async` multiplies a 64 x 16 bf16 A by a 16 x N bf16 B into 64 x N float32
accumulators spread over the warpgroup's registers; it runs asynchronously, so a warp issues
several and waits for them later.

  wgmma_bf16_for(n)(p, a0, a1, a2, a3, s, desc, accumulate): p = A @ B (+ p when
      accumulate != 0) for the warpgroup, N = n columns of B (n a multiple of 8, 8 .. 256); p a
      float32 local array of n / 2 accumulators (registers once the kernel's loops are
      unrolled). A from registers: warp w of the warpgroup holds rows 16 w .. 16 w + 15 as the
      A fragments of mma.m16n8k16 (_ptx.mma_bf16's a0 .. a3), so a tile packed by
      _linear_mma.pack_bf16 feeds it as it is. B from the uint32 shared array s at word i, named
      by desc = b_descriptor(s, 0) + i // 4 (i a multiple of 4: a descriptor counts 16-byte
      units, so a kernel makes the base one once and adds to it; s itself is read only by
      the simulator's stand-in), laid out so: token n's 16 k
      values are two 16-byte rows (k 0..7, k 8..15), 8 tokens' rows of one k half are 128
      contiguous bytes, the two k halves of 8 tokens 256 bytes: word b_word(n, h) = 64 (n //
      8) + 32 h + 4 (n % 8). Accumulators as mma's, per 8 columns: p[4 j] row g col 8 j + 2 t,
      p[4 j + 1] col + 1, p[4 j + 2] and p[4 j + 3] the same at row g + 8 (rows of this warp's
      16, g = lane // 4, t = lane % 4).
  b_descriptor(s, i): the int64 shared-memory matrix descriptor of a B tile at s[i] (start
      address, leading and stride byte offsets; no swizzle). Its start field holds the
      address in 16-byte units in 14 bits, enough for the whole shared window, so adding to
      it moves the start.
  wgmma_fence(): before a wgmma whose A registers or accumulators other instructions wrote
      (`wgmma.fence.sync.aligned`).
  wgmma_commit(): closes the group of this warpgroup's wgmmas issued since the last commit.
  wgmma_waiter(n)(): waits until at most n of this warpgroup's groups are in flight; the A
      registers of those done may be reused then, and the shared memory they read overwritten
      (after a barrier: other warpgroups wait for their own).
  wgmma_settler(n)(p): waits for all groups and hands p's final values on (n / 2 of them,
      as for wgmma_bf16_for(n)): the accumulators pass through the wait instruction, so no
      read of p can move above it.

Shared memory written by ordinary stores or cp.async and read by a wgmma needs
proxy_fence() (`fence.proxy.async.shared::cta`) in the writing thread, then a barrier.
WGMMA says whether the GPU has these (compute capability 9.0 exactly; numba compiles for
sm_90a there). Under numba's simulator the wgmma is computed in float64 from the warpgroup's
fragments, exchanged through the block as _ptx's mma is, the same float operations as that
mma per 8 columns: every thread of the block must call it the same number of times.
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR

B_LBO, B_SBO = 128, 256  # bytes between B's k halves, between its groups of 8 tokens


@cuda.jit(device=True)
def b_word(n, h):
    """Word offset of token n's k half h (8 bf16, 4 words) in a B tile (the docstring above)."""
    return (B_SBO // 4) * (n // 8) + (B_LBO // 4) * h + 4 * (n % 8)


if SIMULATOR:
    from vtllm.kernels.cuda._device import _exchange, _lanes
    from vtllm.kernels.cuda._ptx import _bf16

    WGMMA = True

    def wgmma_fence():
        pass

    def wgmma_commit():
        pass

    def proxy_fence():
        pass

    def wgmma_waiter(n):
        def wait():
            pass

        return wait

    def wgmma_settler(n):
        def settle(p):
            pass

        return settle

    def _b_item(s, i, n, k):
        word = int(s[i + b_word(n, k // 8) + (k % 8) // 2])
        return _bf16(word >> (16 * (k % 2)))

    def b_descriptor(s, i):
        return i // 4  # the start field alone: the stand-in below reads s itself

    def wgmma_bf16_for(cols):
        def wgmma_bf16(p, a0, a1, a2, a3, s, desc, accumulate):
            i = 4 * (int(desc) & 0x3FFF)
            tid, _ = _exchange((a0, a1, a2, a3))
            # this thread's rows g and g + 8 of its warp's 16: lanes 4 g .. 4 g + 3 hold them
            first = tid - tid % 32 + 4 * ((tid % 32) // 4)
            A = np.zeros((2, 16))
            for t in range(4):
                r0, r1, r2, r3 = _lanes[first + t]
                for half in range(2):
                    shift = 16 * half
                    A[0, 2 * t + half] = _bf16(int(r0) >> shift)
                    A[1, 2 * t + half] = _bf16(int(r1) >> shift)
                    A[0, 2 * t + 8 + half] = _bf16(int(r2) >> shift)
                    A[1, 2 * t + 8 + half] = _bf16(int(r3) >> shift)
            B = np.array([[_b_item(s, i, n, k) for n in range(cols)] for k in range(16)])
            D = A @ B
            t = tid % 4
            for j in range(cols // 8):
                for e in range(4):
                    d = D[e // 2, 8 * j + 2 * t + e % 2]
                    p[4 * j + e] = np.float32(d + p[4 * j + e] if accumulate else d)

        return wgmma_bf16

else:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    from vtllm.kernels.cuda._ptx import _I32, _cast_all, _statement
    from vtllm.kernels.cuda._ptx_shared import shared_address

    _F32, _I64 = ir.FloatType(), ir.IntType(64)

    def _hopper() -> bool:
        """Whether the GPU is sm_90 (wgmma is not in later architectures); with none visible
        (an offline compile, tools/kernel_report.py), assume it is."""
        if not cuda.is_available():
            return True
        return cuda.get_current_device().compute_capability == (9, 0)

    WGMMA = _hopper()

    wgmma_fence = _statement("wgmma.fence.sync.aligned;")
    wgmma_commit = _statement("wgmma.commit_group.sync.aligned;")
    proxy_fence = _statement("fence.proxy.async.shared::cta;")

    def wgmma_waiter(n: int):
        return _statement(f"wgmma.wait_group.sync.aligned {int(n)};")

    def _through_asm(
        context, builder, aryty, ary, count, text, in_types=(), in_values=(), in_constraints=()
    ):
        """Loads the count accumulators of the local array ary, runs text with them as tied
        operands $0 .. (results) and then the other inputs ($count ..), and stores the
        results back: side effects and a memory clobber keep it in program order."""
        data = context.make_array(aryty)(context, builder, ary).data
        pointers = [builder.gep(data, [ir.Constant(_I32, e)]) for e in range(count)]
        values = [builder.load(ptr) for ptr in pointers]
        constraints = ["=f"] * count + list(in_constraints) + [str(e) for e in range(count)]
        fnty = ir.FunctionType(ir.LiteralStructType([_F32] * count), [*in_types] + [_F32] * count)
        asm = ir.InlineAsm(fnty, text, ",".join(constraints) + ",~{memory}", side_effect=True)
        res = builder.call(asm, [*in_values] + values)
        for e, ptr in enumerate(pointers):
            builder.store(builder.extract_value(res, e), ptr)

    def wgmma_settler(cols: int):
        count = cols // 2

        @intrinsic
        def settle(typingctx, p):
            def codegen(context, builder, sig, args):
                text = "wgmma.wait_group.sync.aligned 0;"
                _through_asm(context, builder, sig.args[0], args[0], count, text)
                return context.get_dummy_value()

            return types.void(p), codegen

        return settle

    @intrinsic
    def b_descriptor(typingctx, s, i):
        """start address (14 bits of 16-byte units), leading (k) and stride (token) byte
        offsets, each in 16-byte units; no swizzle."""

        def codegen(context, builder, sig, args):
            addr = shared_address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            start = builder.and_(
                builder.lshr(addr, ir.Constant(_I32, 4)), ir.Constant(_I32, 0x3FFF)
            )
            low = builder.or_(start, ir.Constant(_I32, (B_LBO >> 4) << 16))
            return builder.or_(builder.zext(low, _I64), ir.Constant(_I64, (B_SBO >> 4) << 32))

        return types.int64(s, i), codegen

    def wgmma_bf16_for(cols: int):
        if cols % 8 or not 8 <= cols <= 256:
            raise ValueError(f"wgmma: N must be a multiple of 8 in 8 .. 256, got {cols}")
        count = cols // 2
        outs = ", ".join(f"${e}" for e in range(count))
        a = ", ".join(f"${count + e}" for e in range(4))
        text = (
            f"{{ .reg .pred acc; setp.ne.b32 acc, ${count + 5}, 0; "
            f"wgmma.mma_async.sync.aligned.m64n{cols}k16.f32.bf16.bf16 "
            f"{{{outs}}}, {{{a}}}, ${count + 4}, acc, 1, 1, 0; }}"
        )

        @intrinsic
        def wgmma_bf16(typingctx, p, a0, a1, a2, a3, s, desc, accumulate):
            sig = types.void(p, a0, a1, a2, a3, s, desc, accumulate)

            def codegen(context, builder, sig, args):
                regs = _cast_all(context, builder, args[1:5], sig.args[1:5], types.uint32)
                desc = context.cast(builder, args[6], sig.args[6], types.int64)
                acc = context.cast(builder, args[7], sig.args[7], types.int32)
                _through_asm(
                    context,
                    builder,
                    sig.args[0],
                    args[0],
                    count,
                    text,
                    [_I32] * 4 + [_I64, _I32],
                    regs + [desc, acc],
                    ["r"] * 4 + ["l", "r"],
                )
                return context.get_dummy_value()

            return sig, codegen

        return wgmma_bf16
