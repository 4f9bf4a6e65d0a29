"""out = x @ W.T (+ bias) on tensor cores, for bf16 W packed once into mma fragment order.
Hot path: keep it lean.

Packing (pack_bf16, at upload): W [N, K] becomes [N/16, K/16 tiles x 128 words], each 16x16
tile stored as the 32 lanes' A fragments of mma.m16n8k16 (4 uint32 per lane, see _ptx), so a
warp reads a tile as one coalesced 512-byte sweep of 128-bit loads and feeds it straight to
the tensor cores, no shared memory and no shuffles. Rows are padded with zero tiles to whole
rounds of the loop (packed_shape), so the loop has no bounds checks on W.

The product runs transposed, out.T = W @ x.T: a tile of 16 rows of W is the mma's A operand
and 8 rows of x (tokens) its B operand, so a decode step of one to eight tokens fills one
mma's N side and reads W once. x stays float32: each value is split into two bf16, hi (x
rounded) and lo (the remainder rounded), and both go through the tensor cores, so the
activations keep about 17 significant bits (error <= 2^-17 relative) while the weights, bf16
already, are exact. Decode is bound by reading W, so the second mma is free there; prefill is
bound by the tensor cores, so a W packed with x_bf16 skips the lo mma: x rounded to bf16
(relative error <= 2^-9, the activations torch and llama.cpp feed their 16-bit GEMMs), half
the mmas, still float32 sums in the same order (same bits across kernels within a mode), and
x split beforehand (split_x) keeps hi only: half the bytes that prefill moves for x.

Summation order: the K tiles are dealt round-robin to S = warps_for(N, K) slices (slice v:
tiles v, v + S, v + 2 S, ...); each slice is summed in order into float32 accumulators from
+0, and an output is the slices' partials added in slice order, then the bias. Every output
is therefore the same sequence of float operations whatever M is and wherever the token sits
in the batch: decode, batched decode and prefill give the same bits, which the depth-2
executor's law relies on (_gemm_mma follows the same order).

Work split: a block owns one 16-row tile of W and up to TOKENS tokens; warp w sums slice w,
and the block adds the warps' partials in warp order. A block has WARPS warps, or WIDE_WARPS
for a narrow W with a long K (warps_for), whose few row tiles would leave SMs idle. W is read
once per TOKENS tokens; consecutive blocks share a tile of W (the grid's x runs over tokens),
so prefill re-reads it from L2, not HBM. K stays within one block: splitting it over several
blocks a row tile would pass partials through global memory and add a last-block reduction,
which costs more than it gains at these sizes.

Decode steps (M <= 8, one token group) run a copy of the kernel compiled for one group: the
other groups' accumulators are constant zeros there, and the registers they free hold the
next trip's tiles of W, loaded before this trip's mmas, so a warp's loads stay in flight
while it computes (same products and sums: same bits).

FP8 weights (PackedBF16 with a scale, _fp8.pack_fp8): the same tiles in the same fragment
order, one byte a weight (FP8_TILE_WORDS: a lane's 8 codes in two words, one 64-bit load);
each fragment is turned into bf16 in registers (_ptx.e4m3x4_to_bf16x4, exact) and runs the very
same mmas, and each output is its sum times its row's scale (_ptx.mul_rn), before the bias.
Weight-only, x as for bf16 W: prefill here is bound by latency, not by the tensor cores' rate,
so FP8 x FP8 mmas would buy little, while bf16 activations keep the bf16 path's accuracy;
memory and decode's bytes halve either way (Hopper's FP8 mma is a possible next step).

K-quant weights (Q2_K .. Q6_K, PackedBF16 with kq, _kquant_pack): the same tiles hold the
weights' integer codes (4 bits or a byte each) and a scale record per row tile and super-block
(d, dmin, the sub-blocks' scale bytes); each fragment becomes the codes as exact bf16 integers,
and per tile acc = fma(S, mma(codes, x), acc) and acc = fma(-M, mma(ones, x), acc), S and M
the sub-block's scale and minimum: the weights are never rounded. The GEMV that ran K-quant W
before (_linear_kquant) used float32 x and decoded weights: the tensor-core numerics differ
from it (x as hi + lo bf16, or rounded to bf16 with x_bf16), and every route gives a row the
same bits, one-token steps included.

Over 400 lines: the packed format (pack_bf16, split_x, packed_shape) stays beside the kernel
whose loop defines it (warps_for, UNROLL: the K slices that every tensor-core kernel of
matmul sums in, in this kernel's order), so that the two change together.
"""

from dataclasses import dataclass

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._device import MAX_WARPS, SIMULATOR, imin
from vtllm.kernels.cuda._host import aligned, check, is_device_array, placeholder
from vtllm.kernels.cuda._kquant_pack import (
    KQ_TYPES,
    kq_apply,
    kq_codes,
    kq_fragment,
    kq_scales,
    kq_sums,
    kq_tile_words,
    scale_shape,
    tile_words,
)
from vtllm.kernels.cuda._ptx import (
    e4m3x4_to_bf16x4,
    grid_dependency_sync,
    load_f32x2,
    load_u32x2,
    load_u32x4,
    mma_bf16,
    mul_rn,
    split_bf16x2,
)
from vtllm.kernels.cuda.activation import silu_mul
from vtllm.kernels.cuda.norm import THREADS as NORM_THREADS
from vtllm.kernels.cuda.norm import row_inv_rms

WARPS = 2 if SIMULATOR else 8  # K slices per block
# A W of at most WIDE_MAX_TILES row tiles, K at least twice N and at least WIDE_WARPS x UNROLL
# K tiles (one whole round) takes WIDE_WARPS warps per block: such a W has too few row tiles
# to fill the SMs with WARPS-warp blocks, so more warps split its long K. With more row tiles,
# a square W or a short K the wide blocks lose (bench/gpu_linear.py; BENCHMARKS.md,
# Kernels).
WIDE_WARPS = 4 if SIMULATOR else 32
WIDE_MAX_TILES = 2 if SIMULATOR else 256
# Warps' partials the shared array holds at once (48 KB static at most): a wide block adds its
# 32 in two rounds of 16, not four of 8, two barriers fewer each
PARTIAL_ROWS = 2 if SIMULATOR else 16
SUMS = 16 // WARPS  # output sums per thread: a block's 16 x 32 over at least WARPS warps
GROUPS = 4  # 8-token groups per block (the code below is written out for four)
TOKENS = 8 * GROUPS
UNROLL = 4  # tiles of W each warp has in flight (written out below)
TILE_WORDS = 128  # uint32 words per packed 16x16 tile: 32 lanes x 4 registers
FP8_TILE_WORDS = 64  # the same tile of e4m3 codes: 32 lanes x 8 bytes
# x split for W packed with x_bf16 keeps hi only: lane L's two words at 2 L of a 64-word tile
# (half the bytes to move and to keep; split_x)
X_BF16_TILE_WORDS = 64
PACK_THREADS = 256
# a cap of 80 registers a thread (a few bytes spill) fits three blocks on an SM instead of
# two: decode streams W, and the extra warps keep more of it in flight
# (bench/gpu_linear.py)
_REGISTERS = {} if SIMULATOR else {"max_registers": 80}
_WIDE_REGISTERS = {} if SIMULATOR else {"max_registers": 64}  # 1024 threads: 64 fill the SM
PREPACK_ABOVE = 8  # tokens: up to one mma group, x is split inside the kernel (no extra launch)
assert WARPS * 32 >= NORM_THREADS, "a folded norm sums a row with rms_norm's threads"


def warps_for(n: int, k: int) -> int:
    """Warps per block, and so K slices, for W [n, k]: fixed per matrix, whatever M."""
    if n // 16 <= WIDE_MAX_TILES and k >= 2 * n and k // 16 >= WIDE_WARPS * UNROLL:
        return WIDE_WARPS
    return WARPS


def words_of(fp8: bool, kq: int = 0) -> int:
    """uint32 words of a packed 16 x 16 tile of W: bf16, FP8 or K-quant codes of type kq."""
    if kq:
        return tile_words(kq)
    return FP8_TILE_WORDS if fp8 else TILE_WORDS


def packed_shape(n: int, k: int, fp8: bool = False, kq: int = 0) -> tuple[int, int]:
    """K is padded with zero tiles to whole rounds of the kernel's loop (warps x UNROLL
    tiles), so the loop needs no bounds checks on W: the zeros add exact zeros (K-quant
    padding tiles add nothing at all, _kquant_pack)."""
    step = warps_for(n, k) * UNROLL
    rounds = -(-(k // 16) // step)
    return n // 16, rounds * step * words_of(fp8, kq)


@dataclass(frozen=True, slots=True)
class PackedBF16:
    """W [n, k] in fragment order (pack_bf16); data: device uint32 of packed_shape(n, k).
    x_bf16: the kernels multiply it by x rounded to bf16 (one mma a product) instead of
    x split into hi + lo (see the module docstring). scale: None for bf16 W; for FP8 W, the
    device float32 [n] scales of its rows, data holding e4m3 codes (_fp8.pack_fp8). kq: 0, or
    the QType of K-quant W, data holding its codes and scale its uint32 scale records
    (_kquant_pack)."""

    data: object
    n: int
    k: int
    x_bf16: bool = False
    scale: object = None
    kq: int = 0

    @property
    def fp8(self) -> bool:
        return self.scale is not None and not self.kq

    @property
    def words(self) -> int:
        """uint32 words of a packed tile."""
        return words_of(self.fp8, self.kq)

    @property
    def slices(self) -> int:
        """K slices summed in order for every output (see the module docstring)."""
        return warps_for(self.n, self.k)


def packable(n: int, k: int) -> bool:
    return n % 16 == 0 and k % 16 == 0 and n > 0 and k > 0


@cuda.jit(cache=True)
def _pack_kernel(w, packed):
    """One packed word per thread: lane L's register reg of tile (nt, kt) holds
    W[16 nt + g + 8 (reg & 1), 16 kt + 2 t + 8 (reg >> 1) + {0, 1}], g = L // 4, t = L % 4;
    tiles past K are zeros."""
    grid_dependency_sync()
    i = cuda.grid(1)
    per_row = packed.shape[1]
    if i >= packed.shape[0] * per_row:
        return
    nt, rem = i // per_row, i % per_row
    kt, q = rem // TILE_WORDS, rem % TILE_WORDS
    lane, reg = q // 4, q % 4
    row = 16 * nt + lane // 4 + 8 * (reg & 1)
    col = 16 * kt + 2 * (lane % 4) + 8 * (reg >> 1)
    if col >= w.shape[1]:
        packed[nt, rem] = np.uint32(0)
    else:
        packed[nt, rem] = np.uint32(w[row, col]) | (np.uint32(w[row, col + 1]) << np.uint32(16))


@cuda.jit(device=True)
def _words(fp8, kq):
    """words_of, in device code."""
    if kq:
        return kq_tile_words(kq)
    return FP8_TILE_WORDS if fp8 else TILE_WORDS


@cuda.jit(device=True)
def _fragment(packed, nt, kt, lane, fp8):
    """This lane's A fragment of tile kt (row tile nt): four bf16 pairs, converted from its 8
    e4m3 codes for FP8 W."""
    if fp8:
        w0, w1 = load_u32x2(packed, nt, kt * FP8_TILE_WORDS + 2 * lane)
        a0, a1 = e4m3x4_to_bf16x4(w0)
        a2, a3 = e4m3x4_to_bf16x4(w1)
        return a0, a1, a2, a3
    return load_u32x4(packed, nt, kt * TILE_WORDS + 4 * lane)


@cuda.jit(device=True)
def _fragment_of(packed, nt, kt, lane, fp8, kq):
    """_fragment, or for K-quant W its codes as loaded (_kquant_pack.kq_codes: converted in
    _tile). Written out, not a call of _fragment: each call costs the simulator time."""
    if kq:
        return kq_codes(packed, nt, kt, lane, kq)
    if fp8:
        w0, w1 = load_u32x2(packed, nt, kt * FP8_TILE_WORDS + 2 * lane)
        a0, a1 = e4m3x4_to_bf16x4(w0)
        a2, a3 = e4m3x4_to_bf16x4(w1)
        return a0, a1, a2, a3
    return load_u32x4(packed, nt, kt * TILE_WORDS + 4 * lane)


@cuda.jit(device=True)
def _group(x, r, k, a0, a1, a2, a3, c0, c1, c2, c3, x_bf16, norm, nw, inv):
    """One tile of W against 8 tokens (this lane's: row r of x, columns k, k+1, k+8, k+9);
    norm: those values scaled as rms_norm scales them, by inv (row r's) and the weights nw."""
    u0, u1 = load_f32x2(x, r, k)
    v0, v1 = load_f32x2(x, r, k + 8)
    if norm:
        w0, w1 = load_f32x2(nw, 0, k)
        w2, w3 = load_f32x2(nw, 0, k + 8)
        u0, u1, v0, v1 = w0 * (u0 * inv), w1 * (u1 * inv), w2 * (v0 * inv), w3 * (v1 * inv)
    h0, l0 = split_bf16x2(u0, u1)
    h1, l1 = split_bf16x2(v0, v1)
    c0, c1, c2, c3 = mma_bf16(a0, a1, a2, a3, h0, h1, c0, c1, c2, c3)
    if x_bf16:
        return c0, c1, c2, c3
    return mma_bf16(a0, a1, a2, a3, l0, l1, c0, c1, c2, c3)


@cuda.jit(device=True)
def _group_kq(x, r, k, a0, a1, a2, a3, c0, c1, c2, c3, x_bf16, norm, nw, inv, kq, sc):
    """_group for K-quant codes a of type kq, sc their scales (_kquant_pack.kq_apply)."""
    u0, u1 = load_f32x2(x, r, k)
    v0, v1 = load_f32x2(x, r, k + 8)
    if norm:
        w0, w1 = load_f32x2(nw, 0, k)
        w2, w3 = load_f32x2(nw, 0, k + 8)
        u0, u1, v0, v1 = w0 * (u0 * inv), w1 * (u1 * inv), w2 * (v0 * inv), w3 * (v1 * inv)
    h0, l0 = split_bf16x2(u0, u1)
    h1, l1 = split_bf16x2(v0, v1)
    u = kq_sums(h0, h1, l0, l1, x_bf16, kq)
    return kq_apply(a0, a1, a2, a3, h0, h1, l0, l1, c0, c1, c2, c3, x_bf16, kq, sc, u)


@cuda.jit(device=True)
def _group_packed(xp, gi, col, a0, a1, a2, a3, c0, c1, c2, c3, x_bf16, kq, sc):
    """_group with x split beforehand (split_x): this lane's four words (two, x_bf16) in one
    load."""
    if kq:
        if x_bf16:
            h0, h1 = load_u32x2(xp, gi, col)
            l0, l1 = h0, h1  # unused
        else:
            h0, h1, l0, l1 = load_u32x4(xp, gi, col)
        u = kq_sums(h0, h1, l0, l1, x_bf16, kq)
        return kq_apply(a0, a1, a2, a3, h0, h1, l0, l1, c0, c1, c2, c3, x_bf16, kq, sc, u)
    if x_bf16:
        h0, h1 = load_u32x2(xp, gi, col)
        return mma_bf16(a0, a1, a2, a3, h0, h1, c0, c1, c2, c3)
    h0, h1, l0, l1 = load_u32x4(xp, gi, col)
    c0, c1, c2, c3 = mma_bf16(a0, a1, a2, a3, h0, h1, c0, c1, c2, c3)
    return mma_bf16(a0, a1, a2, a3, l0, l1, c0, c1, c2, c3)


@cuda.jit(device=True)
def _tile(
    x,
    xp,
    prepacked,
    g0,
    groups,
    rows,
    kt,
    last,
    lane,
    a,
    acc,
    x_bf16,
    norm,
    nw,
    inv,
    kq,
    kscale,
    nt,
):
    """acc (16 accumulators: 4 groups x 4) advanced by tile kt of W, whose fragment is a; x's
    tile is min(kt, last) (x has no padding: padded tiles of W read its last tile, times
    zeros). Groups past the last token are skipped (block-uniform). norm (one group only): see
    _group. K-quant W: the tile's scales from kscale (row tile nt), _kquant_pack."""
    sc = kq_scales(kscale, nt, kt, lane, kq)
    kt = imin(kt, last)
    a0, a1, a2, a3 = a
    if kq:
        a0, a1, a2, a3 = kq_fragment(a0, a1, kq)
    r0, r1, r2, r3 = rows
    (c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33) = acc
    if prepacked:  # group g0 is the block's first; columns in tile-fragment order
        xw = X_BF16_TILE_WORDS if x_bf16 else TILE_WORDS
        gi, col = g0, kt * xw + (xw // 32) * lane
        c00, c01, c02, c03 = _group_packed(
            xp, gi, col, a0, a1, a2, a3, c00, c01, c02, c03, x_bf16, kq, sc
        )
        if groups > 1:
            c10, c11, c12, c13 = _group_packed(
                xp, gi + 1, col, a0, a1, a2, a3, c10, c11, c12, c13, x_bf16, kq, sc
            )
        if groups > 2:
            c20, c21, c22, c23 = _group_packed(
                xp, gi + 2, col, a0, a1, a2, a3, c20, c21, c22, c23, x_bf16, kq, sc
            )
        if groups > 3:
            c30, c31, c32, c33 = _group_packed(
                xp, gi + 3, col, a0, a1, a2, a3, c30, c31, c32, c33, x_bf16, kq, sc
            )
    elif kq:
        k = kt * 16 + 2 * (lane % 4)
        c00, c01, c02, c03 = _group_kq(
            x, r0, k, a0, a1, a2, a3, c00, c01, c02, c03, x_bf16, norm, nw, inv, kq, sc
        )
        if groups > 1:
            c10, c11, c12, c13 = _group_kq(
                x, r1, k, a0, a1, a2, a3, c10, c11, c12, c13, x_bf16, False, nw, inv, kq, sc
            )
        if groups > 2:
            c20, c21, c22, c23 = _group_kq(
                x, r2, k, a0, a1, a2, a3, c20, c21, c22, c23, x_bf16, False, nw, inv, kq, sc
            )
        if groups > 3:
            c30, c31, c32, c33 = _group_kq(
                x, r3, k, a0, a1, a2, a3, c30, c31, c32, c33, x_bf16, False, nw, inv, kq, sc
            )
    else:
        k = kt * 16 + 2 * (lane % 4)
        c00, c01, c02, c03 = _group(
            x, r0, k, a0, a1, a2, a3, c00, c01, c02, c03, x_bf16, norm, nw, inv
        )
        if groups > 1:
            c10, c11, c12, c13 = _group(
                x, r1, k, a0, a1, a2, a3, c10, c11, c12, c13, x_bf16, False, nw, inv
            )
        if groups > 2:
            c20, c21, c22, c23 = _group(
                x, r2, k, a0, a1, a2, a3, c20, c21, c22, c23, x_bf16, False, nw, inv
            )
        if groups > 3:
            c30, c31, c32, c33 = _group(
                x, r3, k, a0, a1, a2, a3, c30, c31, c32, c33, x_bf16, False, nw, inv
            )
    return (c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33)


@cuda.jit(device=True)
def _linear_mma_block(
    x,
    xp,
    prepacked,
    packed,
    bias,
    has_bias,
    out,
    partial,
    warps,
    one_group,
    x_bf16,
    swiglu,
    norm,
    nw,
    eps,
    accumulate,
    fp8,
    scale,
    kq,
    kscale,
):
    """One block's work (module docstring); warps, one_group, x_bf16, swiglu, norm,
    accumulate, fp8 and kq are constants of the calling kernel, so once inlined the loop
    strides are too, with one_group (M <= 8) the other groups' code folds away and with x_bf16
    the second mma. partial: shared [min(warps, PARTIAL_ROWS), 16, 32]. swiglu, norm
    (one_group only), accumulate: see _linear_mma. fp8: W holds e4m3 codes, scale its rows'
    scales. kq: W holds K-quant codes of that type, kscale their scale records (any uint32 2-D
    array otherwise, never read)."""
    M, K = x.shape
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    tok0 = cuda.blockIdx.x * TOKENS
    nt = cuda.blockIdx.y
    g = lane // 4
    g0 = tok0 // 8
    groups = 1 if one_group else (imin(M - tok0, TOKENS) + 7) // 8
    rows = (
        imin(tok0 + g, M - 1),
        imin(tok0 + 8 + g, M - 1),
        imin(tok0 + 16 + g, M - 1),
        imin(tok0 + 24 + g, M - 1),
    )
    z = np.float32(0.0)
    acc = (z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z)
    last = K // 16 - 1  # x has no padding: padded tiles read its last tile (times zeros)
    ntiles = packed.shape[1] // _words(fp8, kq)
    stride = warps * UNROLL  # UNROLL tiles a trip
    # Before the loop: the first trip's tiles (one_group; the other kernel drops these unused
    # loads). Each is one device-function call, inlined on the GPU (numba's simulator makes
    # every call a locked swap of module globals: the fewer, the faster it runs there).
    f0 = _fragment_of(packed, nt, warp, lane, fp8, kq)
    f1 = _fragment_of(packed, nt, warp + warps, lane, fp8, kq)
    f2 = _fragment_of(packed, nt, warp + 2 * warps, lane, fp8, kq)
    f3 = _fragment_of(packed, nt, warp + 3 * warps, lane, fp8, kq)
    inv = np.float32(0.0)
    if norm:  # this lane's token's, one row at a time; the loads above are in flight meanwhile
        scratch = cuda.shared.array(MAX_WARPS, float32)
        for t in range(M):
            inv_t = row_inv_rms(x, t, eps, scratch)
            if t == rows[0]:
                inv = inv_t
    for kt in range(warp, ntiles, stride):
        if one_group:  # the next trip's tiles (this trip's again on the last trip)
            nk = kt + stride if kt + stride < ntiles else kt
            n0 = _fragment_of(packed, nt, nk, lane, fp8, kq)
            n1 = _fragment_of(packed, nt, nk + warps, lane, fp8, kq)
            n2 = _fragment_of(packed, nt, nk + 2 * warps, lane, fp8, kq)
            n3 = _fragment_of(packed, nt, nk + 3 * warps, lane, fp8, kq)
        else:  # no registers to spare: load this trip's tiles now
            f0 = _fragment_of(packed, nt, kt, lane, fp8, kq)
            f1 = _fragment_of(packed, nt, kt + warps, lane, fp8, kq)
            f2 = _fragment_of(packed, nt, kt + 2 * warps, lane, fp8, kq)
            f3 = _fragment_of(packed, nt, kt + 3 * warps, lane, fp8, kq)
        acc = _tile(
            x, xp, prepacked, g0, groups, rows, kt, last, lane, f0, acc, x_bf16, norm, nw, inv,
            kq, kscale, nt,
        )  # fmt: skip
        acc = _tile(
            x, xp, prepacked, g0, groups, rows, kt + warps, last, lane, f1, acc, x_bf16, norm,
            nw, inv, kq, kscale, nt,
        )  # fmt: skip
        acc = _tile(
            x, xp, prepacked, g0, groups, rows, kt + 2 * warps, last, lane, f2, acc, x_bf16,
            norm, nw, inv, kq, kscale, nt,
        )  # fmt: skip
        acc = _tile(
            x, xp, prepacked, g0, groups, rows, kt + 3 * warps, last, lane, f3, acc, x_bf16,
            norm, nw, inv, kq, kscale, nt,
        )  # fmt: skip
        if one_group:
            f0, f1, f2, f3 = n0, n1, n2, n3
    # The partials are added in warp order, `per_round` warps at a time: the block's 512
    # sums (accumulator e // 32 of lane e % 32) stay in registers, thread t holding sums
    # t, t + 32 warps, ... (SUMS at most).
    tid = cuda.threadIdx.x
    sums = cuda.local.array(SUMS, float32)
    per_round = partial.shape[0]
    for c in range(warps // per_round):
        if warp // per_round == c:
            for i in range(16):
                partial[warp % per_round, i, lane] = acc[i]
        cuda.syncthreads()
        for j in range(SUMS):
            e = tid + j * 32 * warps
            if e < 16 * 32:
                i, src = e // 32, e % 32
                s = partial[0, i, src] if c == 0 else sums[j] + partial[0, i, src]
                for w in range(1, per_round):
                    s += partial[w, i, src]
                sums[j] = s
        cuda.syncthreads()
    if swiglu:  # row r of the tile pairs with row r + 8: accumulator i with i + 2, same lane
        for j in range(SUMS):
            e = tid + j * 32 * warps
            if e < 16 * 32:
                partial[0, e // 32, e % 32] = sums[j]
        cuda.syncthreads()
    for j in range(SUMS):
        e = tid + j * 32 * warps
        if e < 16 * 32:
            i, src = e // 32, e % 32  # accumulator i of lane src: group i // 4, register i % 4
            tok = tok0 + 8 * (i // 4) + 2 * (src % 4) + (i % 2)
            if tok < M:
                s = sums[j]
                row = 16 * nt + src // 4 + 8 * ((i % 4) // 2)
                if fp8:
                    s = mul_rn(s, scale[row])
                if has_bias:
                    s += bias[row]
                if accumulate:  # the residual add rms_norm did: same operands, same bits
                    out[tok, row] = out[tok, row] + s
                elif not swiglu:
                    out[tok, row] = s
                elif i % 4 < 2:  # gate row; its up row's sum is accumulator i + 2's
                    u = partial[0, i + 2, src]
                    if fp8:
                        u = mul_rn(u, scale[row + 8])
                    if has_bias:
                        u += bias[row + 8]
                    out[tok, 8 * nt + src // 4] = silu_mul(s, u)


def _block_kernel(warps, one_group, x_bf16, swiglu, norm=False, accumulate=False, fp8=False, kq=0):
    """A kernel running _linear_mma_block with these constants (decode kernels, one_group,
    split x themselves: prepacked is ignored there). FP8 kernels take the rows' scales as one
    argument more, K-quant ones (kq, a QType) their scale records; the bf16 ones pass bias and
    packed in their places, never read (an array argument costs a launch from Python time)."""
    registers = _WIDE_REGISTERS if warps == WIDE_WARPS else _REGISTERS
    rows = min(warps, PARTIAL_ROWS)

    if kq:

        @cuda.jit(cache=True, **registers)
        def kernel(x, xp, prepacked, packed, bias, has_bias, out, nw, eps, kscale):
            grid_dependency_sync()
            partial = cuda.shared.array((rows, 16, 32), float32)
            _linear_mma_block(
                x,
                xp,
                prepacked and not one_group,
                packed,
                bias,
                has_bias,
                out,
                partial,
                warps,
                one_group,
                x_bf16,
                swiglu,
                norm,
                nw,
                eps,
                accumulate,
                False,
                bias,
                kq,
                kscale,
            )

    elif fp8:

        @cuda.jit(cache=True, **registers)
        def kernel(x, xp, prepacked, packed, bias, has_bias, out, nw, eps, scale):
            grid_dependency_sync()
            partial = cuda.shared.array((rows, 16, 32), float32)
            _linear_mma_block(
                x,
                xp,
                prepacked and not one_group,
                packed,
                bias,
                has_bias,
                out,
                partial,
                warps,
                one_group,
                x_bf16,
                swiglu,
                norm,
                nw,
                eps,
                accumulate,
                fp8,
                scale,
                0,
                packed,
            )

    else:

        @cuda.jit(cache=True, **registers)
        def kernel(x, xp, prepacked, packed, bias, has_bias, out, nw, eps):
            grid_dependency_sync()
            partial = cuda.shared.array((rows, 16, 32), float32)
            _linear_mma_block(
                x,
                xp,
                prepacked and not one_group,
                packed,
                bias,
                has_bias,
                out,
                partial,
                warps,
                one_group,
                x_bf16,
                swiglu,
                norm,
                nw,
                eps,
                accumulate,
                fp8,
                bias,
                0,
                packed,
            )

    return kernel


# (wide, one_group, x_bf16, swiglu, norm, accumulate, fp8, kq) -> kernel; each compiles on its
# first launch. norm and accumulate come with one_group only (_linear_mma), and not together.
_KERNELS = {
    (wide, one_group, x_bf16, swiglu, norm, accumulate, fp8, kq): _block_kernel(
        WIDE_WARPS if wide else WARPS, one_group, x_bf16, swiglu, norm, accumulate, fp8, kq
    )
    for wide in (False, True)
    for one_group in (False, True)
    for x_bf16 in (False, True)
    for swiglu in (False, True)
    for norm, accumulate in ((False, False), (True, False), (False, True))
    for fp8, kq in ((False, 0), (True, 0), *((False, q) for q in KQ_TYPES))
    if one_group or not (norm or accumulate)
    if not (swiglu and accumulate)
}


@cuda.jit(cache=True)
def _pack_x_kernel(x, xp):
    """xp[j, 128 kt + 4 L + (0..3)] = lane L's (hi b0, hi b1, lo b0, lo b1) for group j (tokens
    8j ..; past M the last token again) and tile kt; one thread per lane and tile. For an xp
    half as wide (x_bf16: hi only), xp[j, 64 kt + 2 L + (0, 1)] = (hi b0, hi b1)."""
    grid_dependency_sync()
    i = cuda.grid(1)
    M, K = x.shape
    ktiles = K // 16
    if i >= xp.shape[0] * ktiles * 32:
        return
    j, rem = i // (ktiles * 32), i % (ktiles * 32)
    kt, lane = rem // 32, rem % 32
    r = imin(8 * j + lane // 4, M - 1)
    k = 16 * kt + 2 * (lane % 4)
    h0, l0 = split_bf16x2(x[r, k], x[r, k + 1])
    h1, l1 = split_bf16x2(x[r, k + 8], x[r, k + 9])
    if xp.shape[1] == 4 * K:  # hi only
        col = kt * X_BF16_TILE_WORDS + 2 * lane
        xp[j, col] = np.uint32(h0)
        xp[j, col + 1] = np.uint32(h1)
        return
    col = kt * TILE_WORDS + 4 * lane
    xp[j, col] = np.uint32(h0)
    xp[j, col + 1] = np.uint32(h1)
    xp[j, col + 2] = np.uint32(l0)
    xp[j, col + 3] = np.uint32(l1)


def x_scratch_words(m: int, k: int) -> int:
    """Size (uint32 words) of the scratch _linear_mma needs for an x of shape [m, k]."""
    return -(-m // 8) * 8 * k


def pack_bf16(w, *, x_bf16=False, stream=0) -> PackedBF16:
    """W (bf16 bits, uint16 [N, K], N and K multiples of 16) copied into fragment order, in a
    new device array (allocates: call at upload, not inside a graph capture); x_bf16: see
    PackedBF16."""
    check("pack_bf16", "w", w, np.uint16, 2)
    n, k = w.shape
    if not packable(n, k):
        raise ValueError(f"pack_bf16: N and K must be positive multiples of 16, got {w.shape}")
    packed = cuda.device_array(packed_shape(n, k), np.uint32, stream=stream)
    total = packed.shape[0] * packed.shape[1]
    _pack_kernel[-(-total // PACK_THREADS), PACK_THREADS, stream](w, packed)
    return PackedBF16(packed, n, k, x_bf16)


def split_x(x, x_scratch, *, x_bf16: bool, stream=0):
    """x [M, K] (float32, K a multiple of 16) split into bf16 hi + lo in mma fragment order
    (_pack_x_kernel) in x_scratch (uint32, at least x_scratch_words(M, K), 16-byte aligned);
    returns the view xp [ceil(M / 8), 8 K] that _linear_mma, _linear_rows and _gemm_mma read.
    x_bf16 (for W packed with x_bf16): hi only, xp [ceil(M / 8), 4 K]."""
    check("split_x", "x", x, np.float32, 2)
    check("split_x", "x_scratch", x_scratch, np.uint32, 1)
    m, k = x.shape
    words = x_scratch_words(m, k)
    if x_scratch.shape[0] < words or not aligned(x_scratch, 16):
        raise ValueError(f"split_x: x_scratch needs {words} words, 16-byte aligned")
    groups, per_group = words // (8 * k), (4 if x_bf16 else 8) * k
    xp = x_scratch[: groups * per_group].reshape(groups, per_group)
    threads = xp.shape[0] * (k // 16) * 32
    _pack_x_kernel[-(-threads // PACK_THREADS), PACK_THREADS, stream](x, xp)
    return xp


def check_out(op: str, out) -> None:
    """out: a float32 2-D device array, C-contiguous or a slice of one's columns (a part of
    matmul.MixedRows writing its columns of the step's buffer: the kernels index out by its
    strides)."""
    if (
        is_device_array(out)
        and out.dtype == np.float32
        and len(out.shape) == 2
        and out.strides[1] == 4
        and out.strides[0] >= 4 * out.shape[1]
    ):
        return
    check(op, "out", out, np.float32, 2)


def check_scales(op: str, w: PackedBF16) -> None:
    """W's packed data and its FP8 row scales or K-quant scale records fit its shape."""
    check(op, "packed W", w.data, np.uint32, 2, packed_shape(w.n, w.k, w.fp8, w.kq))
    if w.fp8:
        check(op, "FP8 row scales", w.scale, np.float32, 1, (w.n,))
    elif w.kq:
        tiles = w.data.shape[1] // w.words
        check(op, "K-quant scales", w.scale, np.uint32, 2, scale_shape(w.n, tiles, w.kq))


def check_split_step(op: str, xp, w: PackedBF16, out, bias, *, swiglu=False):
    """The checks of a kernel that reads x split by split_x (xp) and W packed by pack_bf16:
    shapes, dtypes, 16-byte alignment; returns the bias to pass (a placeholder when absent).
    swiglu: out holds silu(gate) * up, half of W's rows wide."""
    check_out(op, out)
    m, n = out.shape[0], out.shape[1] * (2 if swiglu else 1)
    if n != w.n:
        raise ValueError(f"{op}: out {out.shape} does not fit W [{w.n}, {w.k}]")
    check(op, "xp", xp, np.uint32, 2, (-(-m // 8), (4 if w.x_bf16 else 8) * w.k))
    check_scales(op, w)
    if not aligned(w.data, 16) or not aligned(xp, 16):
        raise ValueError(f"{op}: packed W and xp must start on a 16-byte boundary")
    if bias is None:
        return placeholder(np.float32)
    check(op, "bias", bias, np.float32, 1, (n,))
    return bias


def linear_mma(
    x,
    w: PackedBF16,
    out,
    *,
    bias=None,
    x_scratch=None,
    swiglu=False,
    norm_weight=None,
    eps=0.0,
    accumulate=False,
    stream=0,
) -> None:
    """out[M, N] = x[M, K] @ W.T (+ bias[N]) for W packed by pack_bf16. Device arrays; out
    must not overlap x. With x_scratch (uint32, at least x_scratch_words(M, K)), steps of more
    than PREPACK_ABOVE tokens split x once into it first instead of once per tile of W in
    every block: same values, same bits, far fewer instructions. swiglu: W is a gate/up
    matrix whose rows are interleaved in runs of 8 (activation.tile_interleave), and out
    [M, N / 2] gets silu(gate) * up, the bits that silu_and_mul(tile=8) gives on the product:
    the activation is the epilogue, not a kernel of its own.

    Decode steps (M <= PREPACK_ABOVE) fold the norms around the linear in: with norm_weight
    [K], x is the residual stream and the product is of rms_norm(x, norm_weight, eps) (the
    values rms_norm writes, bit for bit, each block summing the rows itself: no norm kernel,
    no normalized copy of x); with accumulate, out += the product (the residual add that
    rms_norm(..., residual=) does next, same bits). The rows are summed one after another, a
    trip to memory and a block reduction each: the forward folds one-token steps only."""
    check("linear_mma", "x", x, np.float32, 2)
    check_out("linear_mma", out)
    m, k = x.shape
    n = out.shape[1] * (2 if swiglu else 1)
    if out.shape[0] != m or (n, k) != (w.n, w.k):
        raise ValueError(f"linear_mma: x {x.shape} and out {out.shape} do not fit W [{w.n}, {w.k}]")
    if not aligned(x, 8):
        raise ValueError("linear_mma: x must start on an 8-byte boundary (64-bit loads)")
    packed = w.data
    check_scales("linear_mma", w)
    if not aligned(packed, 16):
        raise ValueError("linear_mma: packed W must start on a 16-byte boundary")
    if bias is not None:
        check("linear_mma", "bias", bias, np.float32, 1, (n,))
    norm = norm_weight is not None
    if norm:
        check("linear_mma", "norm_weight", norm_weight, np.float32, 1, (k,))
    if (norm or accumulate) and m > PREPACK_ABOVE:
        raise ValueError(
            f"linear_mma: norm_weight and accumulate take steps of at most "
            f"{PREPACK_ABOVE} tokens, got {m}"
        )
    if norm and accumulate:
        raise ValueError("linear_mma: norm_weight and accumulate do not go together")
    if accumulate and swiglu:
        raise ValueError("linear_mma: accumulate and swiglu do not go together")
    if m == 0:
        return
    nw = norm_weight.reshape(1, k) if norm else placeholder(np.float32, 2)
    has_bias = bias is not None
    if not has_bias:
        bias = placeholder(np.float32)
    prepacked = x_scratch is not None and m > PREPACK_ABOVE
    if prepacked:
        xp = split_x(x, x_scratch, x_bf16=w.x_bf16, stream=stream)
    else:
        xp = placeholder(np.uint32, 2)
    grid = (-(-m // TOKENS), n // 16)
    # m <= 8: one token group
    kernel = _KERNELS[w.slices != WARPS, m <= 8, w.x_bf16, swiglu, norm, accumulate, w.fp8, w.kq]
    args = (x, xp, prepacked, packed, bias, has_bias, out, nw, np.float32(eps))
    kernel[grid, w.slices * 32, stream](*args, *(() if w.scale is None else (w.scale,)))
