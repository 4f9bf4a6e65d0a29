"""out = x @ W.T (+ bias) for batched decode steps and mixed steps (9 to a few hundred tokens,
below _gemm_mma's full grids): _linear_mma's products and sums, bit for bit, with ROWS or
WIDE_ROWS row tiles of W per block. Hot path: keep it lean.

_linear_mma gives a block one 16-row tile of W and 32 tokens, so every block re-reads all of
x's fragments from L2: at 32 tokens that is 4x the bytes of W it streams. Here a block owns
ROWS row tiles and reads each x fragment once for all of them: x is read ROWS times less often.
Where the grid stays full with WIDE_ROWS row tiles a block (row_tiles_for), x is read half as
often again: that pays on the larger steps, whose x reads outweigh W's (a serving step of
decodes and a prompt beside them).

Bytes in flight: each warp streams its K tiles (ROWS tiles of W, then the x groups) into its
own ring of STAGES stages in shared memory with cp.async, STAGES - 1 tiles ahead of the one
its mmas use. The copies hold no registers, so a block keeps (STAGES - 1) x 3 KB a warp in
flight, where buffering fragments in registers holds one tile and leaves the kernel waiting
on loads. A warp's ring is its own: warp barriers order its copies and reads, no block
barrier. ROWS x STAGES = 2 x 4 (96 KB, two blocks an SM) came out best or close to it over
the decode and mixed-step shapes among the ring geometries swept (BENCHMARKS.md, Kernels).

Bits: the same as _linear_mma's for every token. W's K tiles are dealt to w.slices slices
(_linear_mma's WARPS, or WIDE_WARPS for a wide W); the block's warps take them WARPS at a time
(passes), warp w of pass p summing slice p WARPS + w from +0 in _linear_mma's order (its padded
tile count, so the zero tiles' +0 additions happen too), each tile as c = mma(A, hi, c);
c = mma(A, lo, c) (only the first for W packed with x_bf16). After each pass the block adds
the pass's partials to the running sums in slice order: _linear_mma's additions, one after
another in slice order. Then the bias, and with swiglu _linear_mma's SwiGLU epilogue.

FP8 W (_fp8.pack_fp8): a ring stage holds its 64-word tiles (16 chunks of 16 bytes each, two
tiles a pass of the warp's copies); each A fragment is converted to bf16 as it leaves shared
memory (_ptx.e4m3x4_to_bf16x4), and each sum is multiplied by its row's scale before the bias,
as _linear_mma does: the same bits. K-quant W (_kquant_pack): a stage holds its 32- or 64-word
code tiles; the codes become bf16 as they leave shared memory (kq_fragment_shared) and each
tile's products go in by kq_apply's steps with each row tile's scales (read from global
memory, kq_scales), x's sums over the tile once a token group (kq_sums): the same bits.

Over 400 lines: one kernel whose ring protocol (copies, waits, the pass loop) must stay beside
its bf16, FP8 and K-quant stage layouts and its launcher's geometry, which change together.
"""

import numpy as np
from numba import cuda, float32, uint32

from vtllm.kernels.cuda._device import SIMULATOR, imin, sync_warp
from vtllm.kernels.cuda._host import allow_dynamic_shared
from vtllm.kernels.cuda._kquant_pack import (
    KQ_TYPES,
    NIBBLE_TILE_WORDS,
    kq_apply,
    kq_fragment_shared,
    kq_scales,
    kq_sums,
)
from vtllm.kernels.cuda._linear_mma import (
    FP8_TILE_WORDS,
    TILE_WORDS,
    TOKENS,
    UNROLL,
    WARPS,
    WIDE_WARPS,
    X_BF16_TILE_WORDS,
    PackedBF16,
    check_split_step,
    words_of,
)
from vtllm.kernels.cuda._ptx import (
    copy_async_commit,
    copy_async_waiter,
    e4m3x4_to_bf16x4,
    grid_dependency_sync,
    mma_bf16,
    mul_rn,
)
from vtllm.kernels.cuda._ptx_shared import copy_async16_to, shared_u32x2, shared_u32x4
from vtllm.kernels.cuda.activation import silu_mul

GROUPS = TOKENS // 8  # token groups per block (32 tokens, as _linear_mma)
THREADS = 32 * WARPS
ROWS = 2  # row tiles of W per block
# ... or WIDE_ROWS, x read half as often, where that still gives WIDE_MIN_BLOCKS blocks
# (row_tiles_for): wider blocks pay on the larger steps, but with too few blocks they leave
# SMs idle and lose more than the x reads save (BENCHMARKS.md, Kernels).
WIDE_ROWS = 4
WIDE_MIN_BLOCKS = 1 if SIMULATOR else 96
STAGES = 4  # K tiles a warp's ring holds: STAGES - 1 in flight during one's mmas
_REGISTERS = {} if SIMULATOR else {"max_registers": 128}  # two blocks an SM
# Blocks a step needs to run here (two blocks an SM fill a 132-SM GPU about once); a step
# with fewer would leave SMs idle and stays in _linear_mma (rows_pay).
MIN_BLOCKS = 1 if SIMULATOR else 128
SUMS = 16 * 32 // THREADS  # a row tile's running sums a thread holds
_WAIT_OLDEST = copy_async_waiter(STAGES - 1)  # the oldest of STAGES copy groups has landed


def _stage_words(x_bf16: bool, rows: int, fp8: bool = False, kq: int = 0) -> int:
    """A ring stage: `rows` tiles of W, then GROUPS x tiles (_copy_tile's layout)."""
    w_words = words_of(fp8, kq)
    return rows * w_words + GROUPS * (X_BF16_TILE_WORDS if x_bf16 else TILE_WORDS)


def shared_bytes(x_bf16: bool, rows: int = ROWS, fp8: bool = False, kq: int = 0) -> int:
    """Dynamic shared memory a block: the warps' rings; the partials reuse them after."""
    return 4 * max(WARPS * STAGES * _stage_words(x_bf16, rows, fp8, kq), WARPS * 16 * 32)


def row_tiles_for(m: int, n: int) -> int:
    """Row tiles of W a block takes for a step of m tokens through W [n, K]."""
    wide = -(-m // TOKENS) * -(-(n // 16) // WIDE_ROWS) >= WIDE_MIN_BLOCKS
    return WIDE_ROWS if wide else ROWS


def _kernels_for(rows: int, fp8: bool, kq: int = 0) -> dict:
    """The kernels for blocks of `rows` row tiles of W, bf16, FP8 or K-quant of type kq
    (constants of their code), by (x_bf16, swiglu)."""
    # register arrays (numba needs their sizes as plain constants): a K tile's W fragments
    # (and K-quant scales), and the accumulators of rows x GROUPS mma outputs; the block's
    # running sums
    a_frags, acc_size, all_sums = 4 * rows, 4 * rows * GROUPS, rows * SUMS
    w_words = words_of(fp8, kq)  # a tile of W, packed

    @cuda.jit(device=True)
    def _copy_tile(ring, at, packed, xp, nt0, last_tile, g0, groups, kt, last_x, lane, x_bf16):
        """K tile kt's `rows` tiles of W from row tile nt0 and x groups g0 .. g0 + groups - 1
        (x's tile min(kt, last_x): x has no padding, W's padded tiles are zeros) into the ring
        stage at ring[at ..], each lane copying 16-byte chunks."""
        if w_words == NIBBLE_TILE_WORDS:  # 8 chunks a tile: four tiles a pass (rows <= 4)
            i = lane // 8
            if i < rows:
                copy_async16_to(
                    ring,
                    at + i * NIBBLE_TILE_WORDS + 4 * (lane % 8),
                    packed,
                    imin(nt0 + i, last_tile),
                    kt * NIBBLE_TILE_WORDS + 4 * (lane % 8),
                )
        elif w_words == FP8_TILE_WORDS:  # 16 chunks a tile: two tiles a pass (rows is even)
            col = kt * FP8_TILE_WORDS + 4 * (lane % 16)
            for u in range(rows // 2):
                i = 2 * u + lane // 16
                copy_async16_to(
                    ring,
                    at + i * FP8_TILE_WORDS + 4 * (lane % 16),
                    packed,
                    imin(nt0 + i, last_tile),
                    col,
                )
        else:
            col = kt * TILE_WORDS + 4 * lane
            for i in range(rows):
                copy_async16_to(
                    ring, at + i * TILE_WORDS + 4 * lane, packed, imin(nt0 + i, last_tile), col
                )
        xk = imin(kt, last_x)
        at += rows * w_words
        if x_bf16:  # 16 chunks a 64-word tile: two groups' chunks a pass of the warp
            for u in range(GROUPS // 2):
                j, piece = 2 * u + lane // 16, lane % 16
                if j < groups:
                    copy_async16_to(
                        ring,
                        at + j * X_BF16_TILE_WORDS + 4 * piece,
                        xp,
                        g0 + j,
                        xk * X_BF16_TILE_WORDS + 4 * piece,
                    )
        else:
            for j in range(GROUPS):
                if j < groups:
                    copy_async16_to(
                        ring, at + j * TILE_WORDS + 4 * lane, xp, g0 + j, xk * TILE_WORDS + 4 * lane
                    )

    @cuda.jit(device=True)
    def _mmas(ring, at, lane, groups, acc, x_bf16, kscale, nt0, last_tile, kt, last_x):
        """acc += this K tile's (kt's) products from the ring stage at ring[at ..]; K-quant W:
        each row tile's scales from kscale (_kquant_pack)."""
        a = cuda.local.array(a_frags, uint32)
        sc = cuda.local.array(a_frags, float32)
        for i in range(rows):
            if kq:  # this lane's codes, to bf16 in registers, and its rows' scales
                a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3] = kq_fragment_shared(
                    ring, at + i * w_words, lane, kq
                )
                sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3] = kq_scales(
                    kscale, imin(nt0 + i, last_tile), kt, lane, kq
                )
            elif fp8:  # this lane's 8 codes, to bf16 in registers
                w0, w1 = shared_u32x2(ring, at + i * FP8_TILE_WORDS + 2 * lane)
                a[4 * i], a[4 * i + 1] = e4m3x4_to_bf16x4(w0)
                a[4 * i + 2], a[4 * i + 3] = e4m3x4_to_bf16x4(w1)
            else:
                a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3] = shared_u32x4(
                    ring, at + i * TILE_WORDS + 4 * lane
                )
        at += rows * w_words
        for j in range(GROUPS):
            if j < groups:  # block-uniform
                if x_bf16:
                    h0, h1 = shared_u32x2(ring, at + j * X_BF16_TILE_WORDS + 2 * lane)
                    l0, l1 = h0, h1  # unused
                else:
                    h0, h1, l0, l1 = shared_u32x4(ring, at + j * TILE_WORDS + 4 * lane)
                if kq:  # x's sums over the tile, once for the row tiles
                    u = kq_sums(h0, h1, l0, l1, x_bf16, kq)
                for i in range(rows):
                    a0, a1, a2, a3 = a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]
                    c = 4 * (i * GROUPS + j)
                    if kq:
                        s = (sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3])
                        acc[c], acc[c + 1], acc[c + 2], acc[c + 3] = kq_apply(
                            a0, a1, a2, a3, h0, h1, l0, l1,
                            acc[c], acc[c + 1], acc[c + 2], acc[c + 3],
                            x_bf16, kq, s, u,
                        )  # fmt: skip
                        continue
                    c0, c1, c2, c3 = mma_bf16(
                        a0, a1, a2, a3, h0, h1, acc[c], acc[c + 1], acc[c + 2], acc[c + 3]
                    )
                    if not x_bf16:  # a constant of the kernel
                        c0, c1, c2, c3 = mma_bf16(a0, a1, a2, a3, l0, l1, c0, c1, c2, c3)
                    acc[c], acc[c + 1], acc[c + 2], acc[c + 3] = c0, c1, c2, c3

    @cuda.jit(device=True)
    def _slice_sum(
        ring,
        ring_at,
        stage_words,
        packed,
        xp,
        nt0,
        last_tile,
        g0,
        groups,
        v,
        slices,
        trips,
        last_x,
        lane,
        acc,
        x_bf16,
        kscale,
    ):
        """acc = this warp's products over slice v of K (tiles v, v + slices, .., trips of them),
        summed from +0 in order, the tiles streamed through the warp's ring."""
        for e in range(acc_size):
            acc[e] = np.float32(0.0)
        for t in range(STAGES - 1):  # the first STAGES - 1 tiles in flight (trips >= UNROLL)
            if t < trips:
                _copy_tile(
                    ring,
                    ring_at + t * stage_words,
                    packed,
                    xp,
                    nt0,
                    last_tile,
                    g0,
                    groups,
                    v + t * slices,
                    last_x,
                    lane,
                    x_bf16,
                )
            copy_async_commit()
        ahead = STAGES - 1  # the stage tile t + STAGES - 1 goes to: the one tile t - 1 used
        here = 0  # the stage of tile t
        for t in range(trips):
            sync_warp()  # every lane is done with tile t - 1's stage before it is refilled
            if t + STAGES - 1 < trips:
                _copy_tile(
                    ring,
                    ring_at + ahead * stage_words,
                    packed,
                    xp,
                    nt0,
                    last_tile,
                    g0,
                    groups,
                    v + (t + STAGES - 1) * slices,
                    last_x,
                    lane,
                    x_bf16,
                )
            copy_async_commit()  # (an empty group past the end keeps the count)
            _WAIT_OLDEST()  # tile t's copies, this lane's, have landed
            sync_warp()  # and the other lanes' (x_bf16 lanes read chunks others copied)
            _mmas(
                ring, ring_at + here * stage_words, lane, groups, acc, x_bf16,
                kscale, nt0, last_tile, v + t * slices, last_x,
            )  # fmt: skip
            ahead = ahead + 1 if ahead + 1 < STAGES else 0
            here = here + 1 if here + 1 < STAGES else 0

    @cuda.jit(device=True)
    def _rows_block(
        xp,
        packed,
        bias,
        has_bias,
        out,
        slices,
        ring,
        partial,
        acc,
        sums,
        stage_words,
        x_bf16,
        swiglu,
        scale,
        kscale,
    ):
        M, N = out.shape
        if swiglu:
            N *= 2
        tid = cuda.threadIdx.x
        lane, warp = tid % 32, tid // 32
        tok0 = cuda.blockIdx.x * TOKENS
        g0 = tok0 // 8
        groups = imin((M - tok0 + 7) // 8, GROUPS)
        nt0 = cuda.blockIdx.y * rows
        last_tile = N // 16 - 1
        last_x = xp.shape[1] // (X_BF16_TILE_WORDS if x_bf16 else TILE_WORDS) - 1
        # every slice has the same number of K tiles: packed K is a multiple of slices x UNROLL
        trips = packed.shape[1] // w_words // slices
        ring_at = warp * STAGES * stage_words
        # A pass: warp w sums slice pass x WARPS + w; the block then adds the pass's partials to
        # the running sums in slice order (one row tile at a time, through the rings' memory):
        # the additions of _linear_mma's block, one after another in slice order.
        for p in range(slices // WARPS):
            _slice_sum(
                ring,
                ring_at,
                stage_words,
                packed,
                xp,
                nt0,
                last_tile,
                g0,
                groups,
                p * WARPS + warp,
                slices,
                trips,
                last_x,
                lane,
                acc,
                x_bf16,
                kscale,
            )
            cuda.syncthreads()  # every warp is done with its ring: the partials reuse the memory
            for i in range(rows):
                for q in range(16):
                    partial[(warp * 16 + q) * 32 + lane] = acc[4 * i * GROUPS + q]
                cuda.syncthreads()
                for u in range(SUMS):
                    e = tid + u * THREADS  # accumulator e // 32 of lane e % 32
                    s = partial[e] if p == 0 else sums[i * SUMS + u] + partial[e]
                    for w in range(1, WARPS):
                        s += partial[w * 16 * 32 + e]
                    sums[i * SUMS + u] = s
                cuda.syncthreads()

        for i in range(rows):
            if swiglu:  # a gate row's up row is 8 rows on: accumulator q + 2 of the same lane
                for u in range(SUMS):
                    partial[tid + u * THREADS] = sums[i * SUMS + u]
                cuda.syncthreads()
            for u in range(SUMS):
                e = tid + u * THREADS
                q, src = e // 32, e % 32  # accumulator q of lane src: group q // 4, register q % 4
                tok = tok0 + 8 * (q // 4) + 2 * (src % 4) + (q % 2)
                row = 16 * (nt0 + i) + src // 4 + 8 * ((q % 4) // 2)
                if tok < M and row < N:
                    s = sums[i * SUMS + u]
                    if fp8:
                        s = mul_rn(s, scale[row])
                    if has_bias:
                        s += bias[row]
                    if not swiglu:
                        out[tok, row] = s
                    elif q % 4 < 2:  # a gate row
                        up = partial[e + 64]
                        if fp8:
                            up = mul_rn(up, scale[row + 8])
                        if has_bias:
                            up += bias[row + 8]
                        out[tok, 8 * (nt0 + i) + src // 4] = silu_mul(s, up)
            if swiglu:
                cuda.syncthreads()

    def _rows_kernel(x_bf16, swiglu):
        """The kernel for W packed with or without x_bf16 (a constant: the lo mma folds away),
        with or without the SwiGLU epilogue. FP8 kernels take the rows' scales as one argument
        more, K-quant ones their scale records (bf16 ones pass bias and packed in their places,
        never read: _linear_mma says why)."""
        stage_words = _stage_words(x_bf16, rows, fp8, kq)

        if kq:

            @cuda.jit(cache=True, **_REGISTERS)
            def kernel(xp, packed, bias, has_bias, out, slices, kscale):
                grid_dependency_sync()
                ring = cuda.shared.array(0, uint32)  # dynamic: the rings, then the partials
                partial = cuda.shared.array(0, float32)
                acc = cuda.local.array(acc_size, float32)  # registers: constant indices
                sums = cuda.local.array(all_sums, float32)
                _rows_block(
                    xp,
                    packed,
                    bias,
                    has_bias,
                    out,
                    slices,
                    ring,
                    partial,
                    acc,
                    sums,
                    stage_words,
                    x_bf16,
                    swiglu,
                    bias,
                    kscale,
                )

        elif fp8:

            @cuda.jit(cache=True, **_REGISTERS)
            def kernel(xp, packed, bias, has_bias, out, slices, scale):
                grid_dependency_sync()
                ring = cuda.shared.array(0, uint32)  # dynamic: the rings, then the partials
                partial = cuda.shared.array(0, float32)
                acc = cuda.local.array(acc_size, float32)  # registers: constant indices
                sums = cuda.local.array(all_sums, float32)
                _rows_block(
                    xp,
                    packed,
                    bias,
                    has_bias,
                    out,
                    slices,
                    ring,
                    partial,
                    acc,
                    sums,
                    stage_words,
                    x_bf16,
                    swiglu,
                    scale,
                    packed,
                )

        else:

            @cuda.jit(cache=True, **_REGISTERS)
            def kernel(xp, packed, bias, has_bias, out, slices):
                grid_dependency_sync()
                ring = cuda.shared.array(0, uint32)  # dynamic: the rings, then the partials
                partial = cuda.shared.array(0, float32)
                acc = cuda.local.array(acc_size, float32)  # registers: constant indices
                sums = cuda.local.array(all_sums, float32)
                _rows_block(
                    xp,
                    packed,
                    bias,
                    has_bias,
                    out,
                    slices,
                    ring,
                    partial,
                    acc,
                    sums,
                    stage_words,
                    x_bf16,
                    swiglu,
                    bias,
                    packed,
                )

        return kernel

    return {
        (x_bf16, swiglu): _rows_kernel(x_bf16, swiglu)
        for x_bf16 in (False, True)
        for swiglu in (False, True)
    }


# (rows, W's type: 0 bf16, 1 FP8, else the K-quant QType) -> (x_bf16, swiglu) -> kernel; each
# compiles on its first launch
_KERNELS = {
    (rows, wt): _kernels_for(rows, wt == 1, 0 if wt < 2 else wt)
    for rows in (ROWS, WIDE_ROWS)
    for wt in (0, 1, *KQ_TYPES)
}


def rows_pay(m: int, n: int) -> bool:
    """Whether a step of m tokens through W [n, K] has blocks enough to run here."""
    return -(-m // TOKENS) * -(-(n // 16) // ROWS) >= MIN_BLOCKS


def linear_rows(xp, w: PackedBF16, out, *, bias=None, swiglu=False, rows=0, stream=0) -> None:
    """out[M, N] = x @ W.T (+ bias[N]) for x split by split_x into xp and W packed by
    pack_bf16: the same bits as linear_mma(x, w, out, bias=bias,
    swiglu=swiglu) (swiglu: out [M, N / 2] gets silu(gate) * up, see _linear_mma). rows: row
    tiles a block, ROWS or WIDE_ROWS (0: row_tiles_for's choice); the same bits either way."""
    has_bias = bias is not None
    bias = check_split_step("linear_rows", xp, w, out, bias, swiglu=swiglu)
    m, n = out.shape[0], w.n
    if m == 0:
        return
    rows = rows or row_tiles_for(m, n)
    grid = (-(-m // TOKENS), -(-(n // 16) // rows))
    kernel = _KERNELS[rows, w.kq or int(w.fp8)][w.x_bf16, swiglu]
    args = (xp, w.data, bias, has_bias, out, w.slices, *(() if w.scale is None else (w.scale,)))
    nbytes = shared_bytes(w.x_bf16, rows, w.fp8, w.kq)
    allow_dynamic_shared(kernel, args, nbytes)
    kernel[grid, THREADS, stream, nbytes](*args)


assert WIDE_WARPS % WARPS == 0  # every W's slices come in whole passes
assert UNROLL >= STAGES - 1  # the prologue's tiles exist (every warp has UNROLL or more)
