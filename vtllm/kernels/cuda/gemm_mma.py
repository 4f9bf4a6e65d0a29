"""out = x @ W.T (+ bias) for steps of many tokens: linear_mma's products and sums, bit for bit,
with the operands shared through shared memory. Hot path: keep it lean.

linear_mma gives each block one 16-row tile of W and 32 tokens and reads every fragment
straight from global memory (L2): each warp moves 5 x 512 bytes per 8 mmas, so prefill is
bound by L2, far from the tensor cores. Here a block owns BLOCK_TILES tiles of W (16 rows
each) x BLOCK_GROUPS groups of 8 tokens; per K tile it copies those A tiles and x groups
(both already in fragment order: W packed by pack_bf16, x split by split_x) into shared
memory once, with cp.async, STAGES tiles ahead, and each warp takes a WT_M x WT_N sub-tile of
it, reading every fragment with one conflict-free 128-bit load (a tile's 512 bytes are
contiguous, lane L reads words 4L .. 4L + 3).

Bits: linear_mma's slice v (of S = w.slices) sums the K tiles v, v + S, v + 2 S, .. in order
(each as c = mma(A, hi, c); c = mma(A, lo, c), from c = +0), then the slices' sums are added
in slice order, then the bias. This kernel walks the K tiles in that order, residue class after
residue class, each class into fresh accumulators p (from +0) that are then folded into the
total S (S = p for the first class, S = S + p after): the same mma on the same fragments
and the same float additions, so the same bits for every token, whatever M and whichever
kernel runs the step. linear_mma's zero tiles padding K only add exact zeros: skipped here.
"""

import numpy as np
from numba import cuda, float32, uint32

from vtllm.kernels.cuda._device import SIMULATOR, imin
from vtllm.kernels.cuda._host import aligned, check, placeholder
from vtllm.kernels.cuda._ptx import (
    copy_async16,
    copy_async_commit,
    copy_async_waiter,
    load_shared_u32x4,
    mma_bf16,
)
from vtllm.kernels.cuda.linear_mma import TILE_WORDS, PackedBF16, packed_shape

# A warp's sub-tile: WT_M tiles of W (16 rows each) x WT_N groups of 8 tokens, 64 x 32 on the
# GPU: 16 accumulator quads in p and 16 in S (128 registers) and 32 mmas per 8 fragment loads
# (4 KB of shared memory per 32 mmas, about what an SM's shared memory serves per mma).
# Warps WARPS_M x WARPS_N: a 128-row x 128-token block, 12 KB of operands per K tile.
# The simulator runs every thread in Python: small tiles there, same code paths.
if SIMULATOR:
    WT_M, WT_N, WARPS_M, WARPS_N, STAGES = 2, 1, 1, 2, 2
else:
    WT_M, WT_N, WARPS_M, WARPS_N, STAGES = 4, 4, 2, 4, 3
BLOCK_TILES = WT_M * WARPS_M  # tiles of W (16 rows) per block
BLOCK_GROUPS = WT_N * WARPS_N  # groups of 8 tokens per block
THREADS = 32 * WARPS_M * WARPS_N
A_WORDS = BLOCK_TILES * TILE_WORDS  # a stage: the A tiles, then the x groups
STAGE_WORDS = (BLOCK_TILES + BLOCK_GROUPS) * TILE_WORDS
A_REGS = 4 * WT_M  # one warp's A fragments
ACCS = 4 * WT_M * WT_N  # accumulators per thread, in p and in S
COPIES = STAGE_WORDS // 4 // THREADS  # 16-byte copies per thread per stage
assert COPIES * THREADS * 4 == STAGE_WORDS and STAGES >= 2
# DeviceWeight.matmul takes this kernel over linear_mma from GEMM_ABOVE tokens, and only when
# the step has GEMM_MIN_BLOCKS block tiles or more: one block fills an SM and walks all of K,
# so a small grid leaves SMs idle (8B qkv at M = 64, 48 blocks: 191 us here, 48 us in
# linear_mma). Measured on the H200 at M = 64 .. 1024 on the 8B and 0.6B shapes
# (tools/device_bench_linear.py --gemm), this rule picks the faster kernel or one within 3%.
GEMM_ABOVE = 128
GEMM_MIN_BLOCKS = 2 if SIMULATOR else 128
_REGISTERS = {} if SIMULATOR else {"max_registers": 255}
_wait_stage = copy_async_waiter(STAGES - 2)  # the oldest stage in flight has landed


@cuda.jit(device=True)
def _load(smem, stage, kt, xp, packed, tid, nt0, g0, last_tile, last_group):
    """Copies K tile kt of the block's A tiles and x groups into smem[stage]; rows past W's
    end and groups past x's read the last ones (their results are not written)."""
    col = kt * TILE_WORDS
    for u in range(COPIES):
        c = tid + u * THREADS  # 16-byte chunk c of the stage: unit c // 32, lane c % 32
        unit, q = c // 32, 4 * (c % 32)
        if unit < BLOCK_TILES:
            copy_async16(smem, stage, 4 * c, packed, imin(nt0 + unit, last_tile), col + q)
        else:
            row = imin(g0 + unit - BLOCK_TILES, last_group)
            copy_async16(smem, stage, 4 * c, xp, row, col + q)


@cuda.jit(device=True)
def _step(smem, stage, wm, wn, lane, a, p):
    """p += this warp's sub-tile of one K tile (smem[stage]): per A tile and x group,
    c = mma(A, hi, c); c = mma(A, lo, c), as linear_mma."""
    for i in range(WT_M):
        a0, a1, a2, a3 = load_shared_u32x4(smem, stage, (wm * WT_M + i) * TILE_WORDS + 4 * lane)
        a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3] = a0, a1, a2, a3
    for j in range(WT_N):
        col = A_WORDS + (wn * WT_N + j) * TILE_WORDS + 4 * lane
        h0, h1, l0, l1 = load_shared_u32x4(smem, stage, col)
        for i in range(WT_M):
            b = 4 * (i * WT_N + j)
            a0, a1, a2, a3 = a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]
            c0, c1, c2, c3 = mma_bf16(a0, a1, a2, a3, h0, h1, p[b], p[b + 1], p[b + 2], p[b + 3])
            c0, c1, c2, c3 = mma_bf16(a0, a1, a2, a3, l0, l1, c0, c1, c2, c3)
            p[b], p[b + 1], p[b + 2], p[b + 3] = c0, c1, c2, c3


@cuda.jit(cache=True, **_REGISTERS)
def _gemm_kernel(xp, packed, bias, has_bias, out, residues):
    M, N = out.shape
    ktiles = xp.shape[1] // TILE_WORDS  # real K tiles (x has no padding)
    last_group = xp.shape[0] - 1
    last_tile = N // 16 - 1
    tid = cuda.threadIdx.x
    lane, warp = tid % 32, tid // 32
    wm, wn = warp // WARPS_N, warp % WARPS_N
    nt0 = cuda.blockIdx.y * BLOCK_TILES
    g0 = cuda.blockIdx.x * BLOCK_GROUPS
    smem = cuda.shared.array((STAGES, STAGE_WORDS), uint32)  # the only one: 16-byte aligned
    a = cuda.local.array(A_REGS, uint32)  # registers: every index is constant once unrolled
    p = cuda.local.array(ACCS, float32)
    s = cuda.local.array(ACCS, float32)
    for e in range(ACCS):
        p[e] = np.float32(0.0)
        s[e] = np.float32(0.0)

    # The K tiles in the order they are summed: residue class r = 0, 1, .. (tiles r,
    # r + residues, ..); the copies run STAGES - 1 tiles ahead of the mmas.
    load_r = load_kt = 0
    for st in range(STAGES - 1):
        if st < ktiles:
            _load(smem, st, load_kt, xp, packed, tid, nt0, g0, last_tile, last_group)
            load_kt += residues
            if load_kt >= ktiles:
                load_r += 1
                load_kt = load_r
        copy_async_commit()  # one group per tile, empty or not: wait_group counts them
    r = kt = 0
    for step in range(ktiles):
        _wait_stage()
        cuda.syncthreads()  # all copies of this tile landed; all warps are done with the last
        if step + STAGES - 1 < ktiles:
            nxt = (step + STAGES - 1) % STAGES
            _load(smem, nxt, load_kt, xp, packed, tid, nt0, g0, last_tile, last_group)
            load_kt += residues
            if load_kt >= ktiles:
                load_r += 1
                load_kt = load_r
        copy_async_commit()
        _step(smem, step % STAGES, wm, wn, lane, a, p)
        kt += residues
        if kt >= ktiles:  # class r complete: fold it in, as linear_mma adds warp r's partial
            for e in range(ACCS):
                s[e] = p[e] if r == 0 else s[e] + p[e]
                p[e] = np.float32(0.0)
            r += 1
            kt = r
    if ktiles < residues:  # linear_mma's idle warps add +0 (turns a -0 into +0)
        for e in range(ACCS):
            s[e] += np.float32(0.0)

    g, t = lane // 4, lane % 4
    for i in range(WT_M):
        row = 16 * (nt0 + wm * WT_M + i) + g
        for j in range(WT_N):
            tok = 8 * (g0 + wn * WT_N + j) + 2 * t
            for e in range(4):  # c0, c1: row g, tokens 2t, 2t + 1; c2, c3: row g + 8
                rr, tk = row + 8 * (e // 2), tok + e % 2
                if tk < M and rr < N:
                    v = s[4 * (i * WT_N + j) + e]
                    if has_bias:
                        v += bias[rr]
                    out[tk, rr] = v


def gemm_pays(m: int, n: int) -> bool:
    """Whether a step of m tokens through W [n, K] should run here rather than in linear_mma."""
    blocks = -(-m // (8 * BLOCK_GROUPS)) * -(-(n // 16) // BLOCK_TILES)
    return m >= GEMM_ABOVE and blocks >= GEMM_MIN_BLOCKS


def gemm_mma(xp, w: PackedBF16, out, *, bias=None, stream=0) -> None:
    """out[M, N] = x @ W.T (+ bias[N]) for x split by split_x into xp (its return value for
    x [M, K]) and W packed by pack_bf16: the same bits as linear_mma(x, w, out, bias=bias),
    faster on steps of many tokens. Device arrays; out must not overlap xp."""
    check("gemm_mma", "out", out, np.float32, 2)
    m, n = out.shape
    k = w.k
    if n != w.n:
        raise ValueError(f"gemm_mma: out {out.shape} does not fit W [{w.n}, {w.k}]")
    check("gemm_mma", "xp", xp, np.uint32, 2, (-(-m // 8), 8 * k))
    packed = w.data
    check("gemm_mma", "packed W", packed, np.uint32, 2, packed_shape(n, k))
    if not aligned(packed, 16) or not aligned(xp, 16):
        raise ValueError("gemm_mma: packed W and xp must start on a 16-byte boundary")
    if bias is not None:
        check("gemm_mma", "bias", bias, np.float32, 1, (n,))
    if m == 0:
        return
    has_bias = bias is not None
    if not has_bias:
        bias = placeholder(np.float32)
    grid = (-(-xp.shape[0] // BLOCK_GROUPS), -(-(n // 16) // BLOCK_TILES))
    _gemm_kernel[grid, THREADS, stream](xp, packed, bias, has_bias, out, w.slices)
