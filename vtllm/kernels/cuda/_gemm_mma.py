"""out = x @ W.T (+ bias) for steps of many tokens: _linear_mma's products and sums, bit for bit,
with the operands shared through shared memory. Hot path: keep it lean.

_linear_mma gives each block one 16-row tile of W and 32 tokens and reads every fragment
straight from global memory (L2), so prefill there is bound by L2, far from the tensor cores.
Here a block owns BLOCK_TILES tiles of W (16 rows each) x BLOCK_GROUPS groups of 8 tokens; it
copies their K tiles (both already in fragment order: W packed by pack_bf16, x split by
split_x) into shared memory with cp.async, a stage of two K tiles at a time, STAGES stages
ahead, and each warp takes a WT_M x WT_N sub-tile of it, reading every fragment with one
conflict-free 128-bit load (a tile's 512 bytes are contiguous, lane L reads words 4L .. 4L + 3).
A warp loads the fragments of the next K tile before it runs this one's mmas (two register
buffers), and the block meets at a barrier once per stage, so the tensor cores are fed while
the loads are in flight.

Bits: _linear_mma's slice v (of S = w.slices) sums the K tiles v, v + S, v + 2 S, .. in order
(each as c = mma(A, hi, c); c = mma(A, lo, c), from c = +0; the first only for W packed with
x_bf16), then the slices' sums are added in slice order, then the bias. This kernel walks the
K tiles in that order, residue class after residue class, each class into fresh register
accumulators p (from +0) that are then folded into the running total, kept in shared memory
(total = p for the first class, total + p after): the same mma on the same fragments and the
same float additions, so the same bits for every token, whatever M and whichever kernel runs
the step. _linear_mma's zero tiles padding K only add exact zeros: skipped here. The total
stays in shared memory, not in registers next to p, so that the registers have room for the
two fragment buffers that let the loads run ahead of the mmas.

FP8 W (_fp8.pack_fp8): its 64-word tiles take half the A part of a stage; each A fragment is
converted to bf16 as it is read into the register buffers (_ptx.e4m3x4_to_bf16x4), so the mmas
are bf16's, and each total is multiplied by its row's scale before the bias, as _linear_mma
does: the same bits.

K-quant W (_kquant_pack): its code tiles (32 or 64 words) take the A part of a stage; the codes
become bf16 as they are read into the register buffers (kq_fragment_shared), and each K tile's
products go into the accumulators by kq_apply's steps (t = mma(codes, x), X = mma(ones, x) once
a token group, acc = fma(S, t, acc), acc = fma(-M, X, acc)) with the scales of the warp's row
tiles loaded for that tile (_row_scales): _linear_mma's operations in its order, the same bits.

Over 400 lines: one kernel whose stage layout, copy and fragment walk serve bf16, FP8 and
K-quant W alike and change together.
"""

import numpy as np
from numba import cuda, float32, int32, uint32

from vtllm.kernels.cuda._device import SIMULATOR, imin
from vtllm.kernels.cuda._host import allow_dynamic_shared
from vtllm.kernels.cuda._kquant_pack import (
    KQ_TYPES,
    kq_apply,
    kq_fragment_shared,
    kq_scales,
    kq_sums,
)
from vtllm.kernels.cuda._linear_mma import (
    TILE_WORDS,
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

# A warp's sub-tile: WT_M tiles of W (16 rows each) x WT_N groups of 8 tokens, 64 x 32 on the
# GPU: 16 accumulator quads (64 registers) and 32 mma pairs per 8 fragment loads (4 KB of
# shared memory per 64 mmas). Warps WARPS_M x WARPS_N: a 128-row x 128-token block, 12 KB of
# operands per K tile (8 KB with x_bf16). The simulator runs every thread in Python: small
# tiles there, same code.
# STAGES and _REGISTERS by x_bf16. x split into hi + lo: 4 stages (160 KB of shared memory)
# and up to 255 registers, one block an SM. x_bf16: 3 stages (112 KB) and a cap of 128
# registers, so that two blocks share an SM (the cap costs a small spill, one local load a
# stage; the second block's overlap more than pays for it, see BENCHMARKS.md, Kernels); the
# hi + lo layout fits neither in half an SM.
if SIMULATOR:
    WT_M, WT_N, WARPS_M, WARPS_N = 2, 1, 1, 2
    STAGES = {False: 2, True: 3}
    _REGISTERS = {False: {}, True: {}}
else:
    WT_M, WT_N, WARPS_M, WARPS_N = 4, 4, 2, 4
    STAGES = {False: 4, True: 3}
    _REGISTERS = {False: {"max_registers": 255}, True: {"max_registers": 128}}
BLOCK_TILES = WT_M * WARPS_M  # tiles of W (16 rows) per block
BLOCK_GROUPS = WT_N * WARPS_N  # groups of 8 tokens per block
THREADS = 32 * WARPS_M * WARPS_N
A_FRAGS = 4 * WT_M  # one warp's A fragments of a K tile, per lane
B_FRAGS = 4 * WT_N  # its x fragments (hi, hi, lo, lo per group; hi, hi with x_bf16)
A_BUFFERS, B_BUFFERS = 2 * A_FRAGS, 2 * B_FRAGS  # two of each: this K tile's, the next's
ACCS = 4 * WT_M * WT_N  # accumulators per thread
A_COPIES = BLOCK_TILES * 32 // THREADS  # 16-byte copies per thread per K tile, of bf16 W's tiles
X_COPIES_MAX = -(-BLOCK_GROUPS * 32 // THREADS)  # and at most these of x's groups
COPIES = A_COPIES + X_COPIES_MAX
assert A_COPIES * THREADS == BLOCK_TILES * 32 and THREADS % 32 == 0
assert min(STAGES.values()) >= 2


def _layout(x_bf16: bool, fp8: bool = False, kq: int = 0) -> dict:
    """Shared memory of a block, in uint32 words, for x split into hi + lo (128-word tiles) or
    rounded to hi only (x_bf16, 64-word tiles), W bf16 (128-word tiles) or FP8 (64): the
    STAGES[x_bf16] stages of two K tiles each (the A tiles, then the x groups), then the
    running totals [ACCS][THREADS]."""
    x_words = X_BF16_TILE_WORDS if x_bf16 else TILE_WORDS
    a_tile = words_of(fp8, kq)
    a_chunks = BLOCK_TILES * a_tile // 4  # 16-byte copies of a K tile's A tiles
    a_words = BLOCK_TILES * a_tile
    tile_span = a_words + BLOCK_GROUPS * x_words
    sums_at = STAGES[x_bf16] * 2 * tile_span
    x_chunks = BLOCK_GROUPS * x_words // 4  # 16-byte copies of a K tile's x groups
    return {
        "a_tile": a_tile,
        "a_words": a_words,
        "a_chunks": a_chunks,
        "a_copies": -(-a_chunks // THREADS),
        "x_words": x_words,
        "tile_span": tile_span,
        "stage_words": 2 * tile_span,
        "sums_at": sums_at,
        "x_chunks": x_chunks,
        "x_copies": -(-x_chunks // THREADS),
        "shared_bytes": 4 * (sums_at + ACCS * THREADS),  # GPU: 160 KB, 112 KB with x_bf16
    }


# DeviceWeight.matmul takes this kernel over _linear_mma from GEMM_ABOVE tokens, and only when
# the step has GEMM_MIN_BLOCKS block tiles or more: one block fills an SM and walks all of K,
# so a small grid leaves SMs idle while _linear_mma, whose warps split K, keeps them all busy.
# The thresholds come from timing both kernels over the 8B and 0.6B shapes
# (bench/gpu_linear.py --gemm; BENCHMARKS.md, Kernels) with x split into hi + lo;
# x_bf16's two blocks an SM may move the line.
GEMM_ABOVE = 128
GEMM_MIN_BLOCKS = 2 if SIMULATOR else 128
# the oldest stage in flight has landed, by stage count: at most stages - 2 copy groups pending
_WAIT_NEXT = {stages: copy_async_waiter(stages - 2) for stages in set(STAGES.values())}


@cuda.jit(device=True)
def _copy_tile(ops, at, kt, xp, packed, tid, rows, lay):
    """Copies K tile kt of the block's A tiles and x groups to ops[at ..]: thread tid's
    16-byte chunks tid, tid + THREADS, .. (A chunk c: tile c // (a_tile / 4), piece
    c % (a_tile / 4); x chunk c: group c // (x_words / 4), piece c % (x_words / 4)), from the
    rows of packed and xp that rows holds (see the kernel). lay: the layout's sizes
    (_kernel_layout), constants of the kernel."""
    a_tile, a_words, a_chunks, a_copies, x_words, x_chunks, x_copies = lay
    col = kt * a_tile + 4 * (tid % (a_tile // 4))
    for u in range(a_copies):
        c = tid + u * THREADS
        if a_chunks % THREADS == 0 or c < a_chunks:  # (a constant test first)
            copy_async16_to(ops, at + 4 * c, packed, rows[u], col)
    xcol = kt * x_words + 4 * (tid % (x_words // 4))
    for u in range(x_copies):
        c = tid + u * THREADS
        if x_chunks % THREADS == 0 or c < x_chunks:
            copy_async16_to(ops, at + a_words + 4 * c, xp, rows[a_copies + u], xcol)


@cuda.jit(device=True)
def _fragments(ops, at, wm, wn, lane, fa, fb, buf, lay, kq):
    """This warp's fragments of the K tile at ops[at ..] into register buffer buf (0 or 1);
    FP8 and K-quant A fragments converted to bf16 on the way."""
    a_tile, a_words, _, _, x_words, _, _ = lay
    for i in range(WT_M):
        e = buf * A_FRAGS + 4 * i
        if kq:
            a0, a1, a2, a3 = kq_fragment_shared(ops, at + (wm * WT_M + i) * a_tile, lane, kq)
        elif a_tile == TILE_WORDS:
            a0, a1, a2, a3 = shared_u32x4(ops, at + (wm * WT_M + i) * TILE_WORDS + 4 * lane)
        else:
            w0, w1 = shared_u32x2(ops, at + (wm * WT_M + i) * a_tile + 2 * lane)
            a0, a1 = e4m3x4_to_bf16x4(w0)
            a2, a3 = e4m3x4_to_bf16x4(w1)
        fa[e], fa[e + 1], fa[e + 2], fa[e + 3] = a0, a1, a2, a3
    for j in range(WT_N):
        x_at = at + a_words + (wn * WT_N + j) * x_words
        e = buf * B_FRAGS + 4 * j
        if x_words == TILE_WORDS:
            h0, h1, l0, l1 = shared_u32x4(ops, x_at + 4 * lane)
            fb[e], fb[e + 1], fb[e + 2], fb[e + 3] = h0, h1, l0, l1
        else:
            fb[e], fb[e + 1] = shared_u32x2(ops, x_at + 2 * lane)


@cuda.jit(device=True)
def _mmas(fa, fb, buf, p, x_bf16, kq, sc):
    """p += the warp's sub-tile of one K tile from register buffer buf: per A tile and x
    group, c = mma(A, hi, c); c = mma(A, lo, c), as _linear_mma (the first only, x_bf16);
    K-quant W: _kquant_pack.kq_apply's steps, with the row tiles' scales sc (_row_scales)."""
    for j in range(WT_N):
        e = buf * B_FRAGS + 4 * j
        h0, h1, l0, l1 = fb[e], fb[e + 1], fb[e + 2], fb[e + 3]
        if kq:  # x's sums over the tile, once for the row tiles
            u = kq_sums(h0, h1, l0, l1, x_bf16, kq)
        for i in range(WT_M):
            f = buf * A_FRAGS + 4 * i
            a0, a1, a2, a3 = fa[f], fa[f + 1], fa[f + 2], fa[f + 3]
            b = 4 * (i * WT_N + j)
            if kq:
                s = (sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3])
                p[b], p[b + 1], p[b + 2], p[b + 3] = kq_apply(
                    a0, a1, a2, a3, h0, h1, l0, l1, p[b], p[b + 1], p[b + 2], p[b + 3],
                    x_bf16, kq, s, u,
                )  # fmt: skip
                continue
            c0, c1, c2, c3 = mma_bf16(a0, a1, a2, a3, h0, h1, p[b], p[b + 1], p[b + 2], p[b + 3])
            if not x_bf16:
                c0, c1, c2, c3 = mma_bf16(a0, a1, a2, a3, l0, l1, c0, c1, c2, c3)
            p[b], p[b + 1], p[b + 2], p[b + 3] = c0, c1, c2, c3


@cuda.jit(device=True)
def _row_scales(kscale, sc, nt, last_tile, kt, lane, kq):
    """sc = the K-quant scales of K tile kt for this warp's WT_M row tiles from nt."""
    for i in range(WT_M):
        sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3] = kq_scales(
            kscale, imin(nt + i, last_tile), kt, lane, kq
        )


@cuda.jit(device=True)
def _fold(sums, p, tid, first, sums_at):
    """A residue class is complete: total = p (first class) or total + p, in _linear_mma's
    slice order; p restarts from +0. Each thread owns its totals (no barrier needed)."""
    for e in range(ACCS):
        at = sums_at + e * THREADS + tid
        sums[at] = p[e] if first else sums[at] + p[e]
        p[e] = np.float32(0.0)


@cuda.jit(device=True)
def _next_position(kt, r, residues, ktiles, sums, p, tid, sums_at):
    """After K tile kt of residue class r went into p: the next position's (kt, r), folding p
    into the totals when the class is complete."""
    kt += residues
    if kt >= ktiles:
        _fold(sums, p, tid, r == 0, sums_at)
        r += 1
        kt = r
    return kt, r


def _gemm_kernel(x_bf16, fp8, kq=0):
    """The kernel for W packed with or without x_bf16 (a constant: the lo mma and its words
    fold away), bf16, FP8 or K-quant of type kq; its shared-memory layout's sizes are constants
    of it too. FP8 kernels take the rows' scales as one argument more, K-quant ones their scale
    records (bf16 ones pass bias and packed in their places, never read: an array argument
    costs a launch from Python time)."""
    layout = _layout(x_bf16, fp8, kq)
    lay = tuple(
        layout[key]
        for key in ("a_tile", "a_words", "a_chunks", "a_copies", "x_words", "x_chunks", "x_copies")
    )
    x_words, x_copies, a_copies = layout["x_words"], layout["x_copies"], layout["a_copies"]
    a_pieces = layout["a_tile"] // 4  # 16-byte chunks of a tile of W
    tile_span, stage_words, sums_at = layout["tile_span"], layout["stage_words"], layout["sums_at"]
    stages, wait_next = STAGES[x_bf16], _WAIT_NEXT[STAGES[x_bf16]]

    @cuda.jit(device=True)
    def body(xp, packed, bias, has_bias, out, residues, scale, kscale, ops, sums, fa, fb, p, rows):
        M, N = out.shape
        ktiles = xp.shape[1] // x_words  # real K tiles (x has no padding)
        nstages = (ktiles + 1) // 2
        last_group = xp.shape[0] - 1
        last_tile = N // 16 - 1
        tid = cuda.threadIdx.x
        lane, warp = tid % 32, tid // 32
        wm, wn = warp // WARPS_N, warp % WARPS_N
        nt0 = cuda.blockIdx.y * BLOCK_TILES
        g0 = cuda.blockIdx.x * BLOCK_GROUPS
        for e in range(ACCS):
            p[e] = np.float32(0.0)
        # the rows this thread copies from, the same for every K tile: W's row tile, x's token
        # group (past W's end or x's, the last one: those results are not written)
        for u in range(a_copies):
            rows[u] = imin(nt0 + (tid + u * THREADS) // a_pieces, last_tile)
        for u in range(x_copies):
            unit = (tid + u * THREADS) // (x_words // 4)
            rows[a_copies + u] = imin(g0 + unit, last_group)

        # Position q of the summation order is K tile kt(q): residue class r = 0, 1, .. (tiles r,
        # r + residues, ..). Stage s holds positions 2 s and 2 s + 1; copies run stages - 1 stages
        # ahead of the mmas, one commit group per stage, empty or not (wait_group counts them).
        load_r = load_kt = 0
        for s in range(stages - 1):
            for t in range(2):
                if 2 * s + t < ktiles:
                    at = s * stage_words + t * tile_span
                    _copy_tile(ops, at, load_kt, xp, packed, tid, rows, lay)
                    load_kt += residues
                    if load_kt >= ktiles:
                        load_r += 1
                        load_kt = load_r
            copy_async_commit()
        wait_next()
        cuda.syncthreads()
        _fragments(ops, 0, wm, wn, lane, fa, fb, 0, lay, kq)
        sc = cuda.local.array(A_FRAGS, float32)  # K-quant: this K tile's scales (registers)
        ntw = nt0 + wm * WT_M

        r = kt = 0
        # stage s's slot, (s % stages) * stage_words, stepped rather than divided (stages
        # need not be a power of two, and an integer modulo is a long instruction sequence)
        here = 0
        for s in range(nstages):
            # refill the slot stage s - 1 used: every warp read it before the last barrier
            refill = here - stage_words if here > 0 else (stages - 1) * stage_words
            ahead = s + stages - 1
            if ahead < nstages:
                for t in range(2):
                    if 2 * ahead + t < ktiles:
                        at = refill + t * tile_span
                        _copy_tile(ops, at, load_kt, xp, packed, tid, rows, lay)
                        load_kt += residues
                        if load_kt >= ktiles:
                            load_r += 1
                            load_kt = load_r
            copy_async_commit()
            # first K tile of the stage (buffer 0); the second's fragments load meanwhile
            _fragments(ops, here + tile_span, wm, wn, lane, fa, fb, 1, lay, kq)
            if kq:
                _row_scales(kscale, sc, ntw, last_tile, kt, lane, kq)
            _mmas(fa, fb, 0, p, x_bf16, kq, sc)
            kt, r = _next_position(kt, r, residues, ktiles, sums, p, tid, sums_at)
            # second K tile (buffer 1); the next stage's first tile loads once it has landed
            wait_next()
            cuda.syncthreads()
            here = here + stage_words if here + stage_words < stages * stage_words else 0
            _fragments(ops, here, wm, wn, lane, fa, fb, 0, lay, kq)
            if 2 * s + 1 < ktiles:
                if kq:
                    _row_scales(kscale, sc, ntw, last_tile, kt, lane, kq)
                _mmas(fa, fb, 1, p, x_bf16, kq, sc)
                kt, r = _next_position(kt, r, residues, ktiles, sums, p, tid, sums_at)
        # _linear_mma's idle warps add +0 when there are fewer K tiles than slices (turns -0 to +0)
        zero_fix = ktiles < residues

        g, t = lane // 4, lane % 4
        for i in range(WT_M):
            row = 16 * (nt0 + wm * WT_M + i) + g
            for j in range(WT_N):
                tok = 8 * (g0 + wn * WT_N + j) + 2 * t
                for e in range(4):  # c0, c1: row g, tokens 2t, 2t + 1; c2, c3: row g + 8
                    rr, tk = row + 8 * (e // 2), tok + e % 2
                    if tk < M and rr < N:
                        v = sums[sums_at + (4 * (i * WT_N + j) + e) * THREADS + tid]
                        if zero_fix:
                            v += np.float32(0.0)
                        if fp8:
                            v = mul_rn(v, scale[rr])
                        if has_bias:
                            v += bias[rr]
                        out[tk, rr] = v

    if kq:

        @cuda.jit(cache=True, **_REGISTERS[x_bf16])
        def kernel(xp, packed, bias, has_bias, out, residues, kscale):
            grid_dependency_sync()
            ops = cuda.shared.array(0, uint32)  # dynamic: the stages, then the totals
            sums = cuda.shared.array(0, float32)  # the same memory, as floats past sums_at
            fa = cuda.local.array(A_BUFFERS, uint32)  # registers: constant indices once unrolled
            fb = cuda.local.array(B_BUFFERS, uint32)
            p = cuda.local.array(ACCS, float32)
            rows = cuda.local.array(COPIES, int32)
            body(
                xp, packed, bias, has_bias, out, residues, bias, kscale, ops, sums, fa, fb, p, rows
            )

    elif fp8:

        @cuda.jit(cache=True, **_REGISTERS[x_bf16])
        def kernel(xp, packed, bias, has_bias, out, residues, scale):
            grid_dependency_sync()
            ops = cuda.shared.array(0, uint32)  # dynamic: the stages, then the totals
            sums = cuda.shared.array(0, float32)  # the same memory, as floats past sums_at
            fa = cuda.local.array(A_BUFFERS, uint32)  # registers: constant indices once unrolled
            fb = cuda.local.array(B_BUFFERS, uint32)
            p = cuda.local.array(ACCS, float32)
            rows = cuda.local.array(COPIES, int32)
            body(
                xp, packed, bias, has_bias, out, residues, scale, packed, ops, sums, fa, fb, p, rows
            )

    else:

        @cuda.jit(cache=True, **_REGISTERS[x_bf16])
        def kernel(xp, packed, bias, has_bias, out, residues):
            grid_dependency_sync()
            ops = cuda.shared.array(0, uint32)  # dynamic: the stages, then the totals
            sums = cuda.shared.array(0, float32)  # the same memory, as floats past sums_at
            fa = cuda.local.array(A_BUFFERS, uint32)  # registers: constant indices once unrolled
            fb = cuda.local.array(B_BUFFERS, uint32)
            p = cuda.local.array(ACCS, float32)
            rows = cuda.local.array(COPIES, int32)
            body(
                xp, packed, bias, has_bias, out, residues, bias, packed, ops, sums, fa, fb, p, rows
            )

    return kernel


# (x_bf16, W's type: 0 bf16, 1 FP8, else the K-quant QType) -> kernel
_KERNELS = {
    (x_bf16, wt): _gemm_kernel(x_bf16, wt == 1, 0 if wt < 2 else wt)
    for x_bf16 in (False, True)
    for wt in (0, 1, *KQ_TYPES)
}


def gemm_pays(m: int, n: int) -> bool:
    """Whether a step of m tokens through W [n, K] should run here rather than in _linear_mma."""
    blocks = -(-m // (8 * BLOCK_GROUPS)) * -(-(n // 16) // BLOCK_TILES)
    return m >= GEMM_ABOVE and blocks >= GEMM_MIN_BLOCKS


def gemm_mma(xp, w: PackedBF16, out, *, bias=None, stream=0) -> None:
    """out[M, N] = x @ W.T (+ bias[N]) for x split by split_x into xp (its return value for
    x [M, K]) and W packed by pack_bf16: the same bits as linear_mma(x, w, out, bias=bias),
    faster on steps of many tokens. Device arrays; out must not overlap xp."""
    has_bias = bias is not None
    bias = check_split_step("gemm_mma", xp, w, out, bias)
    m, n = out.shape
    if m == 0:
        return
    args = (xp, w.data, bias, has_bias, out, w.slices, *(() if w.scale is None else (w.scale,)))
    kernel = _KERNELS[w.x_bf16, w.kq or int(w.fp8)]
    nbytes = _layout(w.x_bf16, w.fp8, w.kq)["shared_bytes"]
    allow_dynamic_shared(kernel, args, nbytes)
    grid = (-(-xp.shape[0] // BLOCK_GROUPS), -(-(n // 16) // BLOCK_TILES))
    kernel[grid, THREADS, stream, nbytes](*args)
