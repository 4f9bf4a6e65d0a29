"""out = x @ W.T (+ bias) for batched decode steps (9 to ~128 tokens): linear_mma's products and
sums, bit for bit, with ROWS row tiles of W per block. Hot path: keep it lean.

linear_mma gives a block one 16-row tile of W and 32 tokens, so every block re-reads all of
x's fragments from L2: at 32 tokens that is 4x the bytes of W it streams (8B gate_up at M = 32
ran at ~2.2 TB/s of W where torch reaches ~4). Here a block owns ROWS row tiles; warp w
still sums slice w of K (tiles w, w + WARPS, ..), but loads each x fragment once for all ROWS
tiles, so x is read ROWS times less often. A warp loads the next K tile's W and x fragments
before it runs this one's mmas (two register buffers), keeping loads in flight.

ROWS = 2 at 128 registers (two blocks an SM) beat 4 row tiles at 168 registers (one block) on
every measured shape and batch (BENCHMARKS.md), so 2 is the only count built.

Bits: the same as linear_mma's for every token: warp w sums its K tiles (linear_mma's padded
count, so the zero tiles' +0 additions happen too) from +0 in the same order, each as
c = mma(A, hi, c); c = mma(A, lo, c) (only the first for W packed with x_bf16); the block
adds the warps' partials in warp order, then the bias. Only W with linear_mma's WARPS
slices (w.slices == WARPS) runs here.
"""

import numpy as np
from numba import cuda, float32, uint32

from vtllm.kernels.cuda._device import SIMULATOR, imin
from vtllm.kernels.cuda._ptx import grid_dependency_sync, load_u32x2, load_u32x4, mma_bf16
from vtllm.kernels.cuda.linear_mma import (
    TILE_WORDS,
    TOKENS,
    UNROLL,
    WARPS,
    X_BF16_TILE_WORDS,
    PackedBF16,
    check_split_step,
)

GROUPS = TOKENS // 8  # token groups per block (32 tokens, as linear_mma)
THREADS = 32 * WARPS
ROWS = 2  # row tiles of W per block
_REGISTERS = {} if SIMULATOR else {"max_registers": 128}  # two blocks an SM
# Blocks a step needs to run here (132 SMs on the H200, two blocks each fill them about
# once); a step with fewer would leave SMs idle and stays in linear_mma (rows_pay).
MIN_BLOCKS = 1 if SIMULATOR else 128
# register arrays (numba needs their sizes as plain constants): two buffers of fragments
A_FRAGS, B_FRAGS, ACC = 8 * ROWS, 8 * GROUPS, 4 * ROWS * GROUPS


@cuda.jit(device=True)
def _load(packed, xp, nt0, last_tile, g0, groups, kt, xk, lane, fa, fb, buf, rows, x_bf16):
    """This lane's fragments of K tile kt (x's tile xk) into register buffer buf: rows tiles
    of W from row tile nt0, up to GROUPS token groups from group g0 (hi only, x_bf16)."""
    col = kt * TILE_WORDS + 4 * lane
    for i in range(rows):
        e = 4 * (buf * rows + i)
        fa[e], fa[e + 1], fa[e + 2], fa[e + 3] = load_u32x4(packed, imin(nt0 + i, last_tile), col)
    for j in range(GROUPS):
        if j < groups:
            e = 4 * (buf * GROUPS + j)
            if x_bf16:
                fb[e], fb[e + 1] = load_u32x2(xp, g0 + j, xk * X_BF16_TILE_WORDS + 2 * lane)
            else:
                xcol = xk * TILE_WORDS + 4 * lane
                fb[e], fb[e + 1], fb[e + 2], fb[e + 3] = load_u32x4(xp, g0 + j, xcol)


@cuda.jit(device=True)
def _mmas(fa, fb, buf, groups, acc, rows, x_bf16):
    for j in range(GROUPS):
        if j < groups:  # block-uniform
            e = 4 * (buf * GROUPS + j)
            h0, h1, l0, l1 = fb[e], fb[e + 1], fb[e + 2], fb[e + 3]
            for i in range(rows):
                f = 4 * (buf * rows + i)
                a0, a1, a2, a3 = fa[f], fa[f + 1], fa[f + 2], fa[f + 3]
                c = 4 * (i * GROUPS + j)
                c0, c1, c2, c3 = mma_bf16(
                    a0, a1, a2, a3, h0, h1, acc[c], acc[c + 1], acc[c + 2], acc[c + 3]
                )
                if not x_bf16:  # a constant of the kernel
                    c0, c1, c2, c3 = mma_bf16(a0, a1, a2, a3, l0, l1, c0, c1, c2, c3)
                acc[c], acc[c + 1], acc[c + 2], acc[c + 3] = c0, c1, c2, c3


@cuda.jit(device=True)
def _rows_block(xp, packed, bias, has_bias, out, fa, fb, acc, partial, rows, x_bf16):
    M, N = out.shape
    tid = cuda.threadIdx.x
    lane, warp = tid % 32, tid // 32
    tok0 = cuda.blockIdx.x * TOKENS
    g0 = tok0 // 8
    groups = imin((M - tok0 + 7) // 8, GROUPS)
    nt0 = cuda.blockIdx.y * rows
    last_tile = N // 16 - 1
    xw = X_BF16_TILE_WORDS if x_bf16 else TILE_WORDS
    last_x = xp.shape[1] // xw - 1  # x has no padding: padded tiles read its last
    ntiles = packed.shape[1] // TILE_WORDS  # a multiple of WARPS x UNROLL: every warp
    for e in range(4 * rows * GROUPS):  # has the same number of tiles
        acc[e] = np.float32(0.0)

    _load(packed, xp, nt0, last_tile, g0, groups, warp, imin(warp, last_x), lane, fa, fb, 0,
          rows, x_bf16)  # fmt: skip
    for kt in range(warp, ntiles, 2 * WARPS):  # two K tiles a trip: buffers 0 and 1
        k1 = kt + WARPS
        _load(packed, xp, nt0, last_tile, g0, groups, k1, imin(k1, last_x), lane, fa, fb, 1,
              rows, x_bf16)  # fmt: skip
        _mmas(fa, fb, 0, groups, acc, rows, x_bf16)
        k2 = imin(kt + 2 * WARPS, ntiles - WARPS + warp)  # past the end: the last again
        _load(packed, xp, nt0, last_tile, g0, groups, k2, imin(k2, last_x), lane, fa, fb, 0,
              rows, x_bf16)  # fmt: skip
        _mmas(fa, fb, 1, groups, acc, rows, x_bf16)

    # The warps' partials added in warp order, one row tile at a time, as linear_mma's block.
    for i in range(rows):
        for q in range(16):
            partial[warp, q, lane] = acc[4 * i * GROUPS + q]
        cuda.syncthreads()
        for e in range(tid, 16 * 32, THREADS):
            q, src = e // 32, e % 32  # accumulator q of lane src: group q // 4, register q % 4
            tok = tok0 + 8 * (q // 4) + 2 * (src % 4) + (q % 2)
            row = 16 * (nt0 + i) + src // 4 + 8 * ((q % 4) // 2)
            if tok < M and row < N:
                s = partial[0, q, src]
                for w in range(1, WARPS):
                    s += partial[w, q, src]
                if has_bias:
                    s += bias[row]
                out[tok, row] = s
        cuda.syncthreads()


def _rows_kernel(x_bf16):
    """The kernel for W packed with or without x_bf16 (a constant: the lo mma folds away)."""

    @cuda.jit(cache=True, **_REGISTERS)
    def kernel(xp, packed, bias, has_bias, out):
        grid_dependency_sync()
        fa = cuda.local.array(A_FRAGS, uint32)  # registers: constant indices once unrolled
        fb = cuda.local.array(B_FRAGS, uint32)
        acc = cuda.local.array(ACC, float32)
        partial = cuda.shared.array((WARPS, 16, 32), float32)
        _rows_block(xp, packed, bias, has_bias, out, fa, fb, acc, partial, ROWS, x_bf16)

    return kernel


_KERNELS = {x_bf16: _rows_kernel(x_bf16) for x_bf16 in (False, True)}


def rows_fit(w: PackedBF16) -> bool:
    """Whether W can run here (linear_mma's WARPS slices; wide W keep linear_mma)."""
    return w.slices == WARPS


def rows_pay(m: int, n: int) -> bool:
    """Whether a step of m tokens through W [n, K] has blocks enough to run here."""
    return -(-m // TOKENS) * -(-(n // 16) // ROWS) >= MIN_BLOCKS


def linear_rows(xp, w: PackedBF16, out, *, bias=None, stream=0) -> None:
    """out[M, N] = x @ W.T (+ bias[N]) for x split by split_x into xp and W packed by
    pack_bf16 with rows_fit(w): the same bits as linear_mma(x, w, out, bias=bias)."""
    has_bias = bias is not None
    bias = check_split_step("linear_rows", xp, w, out, bias)
    m, n = out.shape
    if not rows_fit(w):
        raise ValueError(f"linear_rows: W [{n}, {w.k}] is sliced {w.slices} ways, not {WARPS}")
    if m == 0:
        return
    grid = (-(-m // TOKENS), -(-(n // 16) // ROWS))
    _KERNELS[w.x_bf16][grid, THREADS, stream](xp, w.data, bias, has_bias, out)


assert UNROLL % 2 == 0  # padded K is a whole number of two-tile trips per warp
