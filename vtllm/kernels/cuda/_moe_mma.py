"""The routed experts on tensor cores, for bf16 experts whose sides are multiples of 16: out[p]
= x[row(p)] @ W_e.T for each (token, rank) pair p = t * k + r, e = ids[t, r] read on the
device. Hot path: keep it lean.

Packing (pack_experts, at upload): each expert's [N, K] is packed by _linear_mma.pack_bf16 on
its own (its own warps_for(N, K), so its own K padding and slices) and the experts' packed
row tiles are stacked: expert e's row tile nt is row e * N / 16 + nt of one uint32 array.

The pairs come grouped by expert (_moe_route.group with PAIRS_PER_TILE pairs a tile: one
mma's N side). The grid is (tiles of pairs, 16-row tiles of W): the grid's x runs over the
tiles, which are sorted by expert, so the blocks that read one expert's row tile run side by
side and all but the first find it in L2. A block multiplies its expert's row tile by its
pairs' rows of x (gathered: row(p) is t where x holds a row per token, gate/up, p where it
holds one per pair, down), exactly as _linear_mma's one-group kernel multiplies a row tile by
8 tokens, with its device functions: the K tiles dealt round-robin to the slices of
warps_for(N, K) (warp w: tiles w, w + S, ...), each slice summed in order from +0 with one
mma per tile (two where x is split into hi + lo, not x_bf16), the slices' partials added in
warp order. Blocks past the step's tiles exit, so the grid is sized from the step's static
maximum and a captured graph replays any routing.

Why the bits are step-invariant: an mma's output column is a function of that column of B
(one pair's x values) and of A and C alone, so a pair's sums are the float operations
linear_mma does for that row of x with that expert's packed W, whatever pairs share its tile,
however many tokens the step has and wherever the grouping placed it. Slots of a tile past
its pairs repeat its last pair (computed, never stored). A token's bits are therefore the same
in a decode step, a batched step or a long prefill.

Cost (a 1,024-token step of Qwen3-30B-A3B's shape: 8,192 pairs, ~64 an expert): a block
reads a 16 x K tile of W (bf16) and 8 gathered rows of x (float32) for 2 x 16 x 8 x K flops, 4
flops a byte, and every row tile of W re-reads x: gate/up moves about 6.4 GB of x and 6.9 GB
of W through L2 for 55 GFLOP, down about half that. Bound by L2 bandwidth (a few ms a layer),
not by HBM (each expert's W comes from memory about once) nor by the tensor cores (~0.1 ms):
blocks that keep x for several row tiles (x split once, its fragments used for each) and
more pairs a block (as _linear_mma's four groups) are the next steps.
"""

from dataclasses import dataclass

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._device import imin
from vtllm.kernels.cuda._host import aligned, check
from vtllm.kernels.cuda._linear_mma import (
    _REGISTERS,
    _WIDE_REGISTERS,
    TILE_WORDS,
    UNROLL,
    WARPS,
    WIDE_WARPS,
    _fragment,
    _group,
    pack_bf16,
    packable,
    packed_shape,
    warps_for,
)
from vtllm.kernels.cuda._moe_route import tile_pairs
from vtllm.kernels.cuda._ptx import grid_dependency_sync

PAIRS_PER_TILE = 8  # one mma's N side: the pairs of one expert a block takes
_Z = np.float32(0.0)


@dataclass(frozen=True, slots=True)
class PackedExperts:
    """A layer's experts [E, n, k] in fragment order (pack_experts); data: device uint32
    [E * n / 16, packed_shape(n, k)[1]]. x_bf16: see _linear_mma.PackedBF16."""

    data: object
    num_experts: int
    n: int
    k: int
    x_bf16: bool = False

    @property
    def slices(self) -> int:
        return warps_for(self.n, self.k)


def pack_experts(mats: list, *, x_bf16: bool = False, stream=0) -> PackedExperts:
    """mats: every expert's W as bf16 bits (host uint16 [n, k], one shape, n and k multiples
    of 16), packed one by one into one stacked device array (allocates: call at upload)."""
    shapes = {tuple(m.shape) for m in mats}
    if not mats or len(shapes) != 1 or not packable(*next(iter(shapes))):
        raise ValueError(f"pack_experts: experts of one 16-aligned shape needed, got {shapes}")
    n, k = shapes.pop()
    tiles, words = packed_shape(n, k)
    data = cuda.device_array((len(mats) * tiles, words), np.uint32, stream=stream)
    sync = stream.synchronize if stream else cuda.synchronize
    for e, m in enumerate(mats):
        raw = cuda.to_device(np.ascontiguousarray(m, np.uint16), stream=stream)
        one = pack_bf16(raw, x_bf16=x_bf16, stream=stream)
        data[e * tiles : (e + 1) * tiles].copy_to_device(one.data, stream=stream)
        sync()  # raw and one are freed on the next trip: one expert's copies at a time
    return PackedExperts(data, len(mats), n, k, x_bf16)


@cuda.jit(device=True)
def _experts_mma_block(x, order, es, ts, packed, num_experts, k, per_token, col0, out, warps,
                       x_bf16, partial):  # fmt: skip
    j = cuda.blockIdx.x
    if j >= ts[num_experts]:  # past the step's tiles (block-uniform)
        return
    lane = cuda.threadIdx.x % 32
    warp = cuda.threadIdx.x // 32
    row_tiles = packed.shape[0] // num_experts
    nt = cuda.blockIdx.y
    e, first, cnt = tile_pairs(j, es, ts, num_experts, PAIRS_PER_TILE)
    p = order[first + imin(lane // 4, cnt - 1)]  # this lane's column of B: its pair's row of x
    r = p // k if per_token else p
    tile_row = e * row_tiles + nt
    last = x.shape[1] // 16 - 1  # padded tiles of W read x's last tile (times zeros)
    ntiles = packed.shape[1] // TILE_WORDS
    stride = warps * UNROLL
    inv = _Z
    c0 = c1 = c2 = c3 = _Z
    # _linear_mma's one-group loop: the next trip's tiles load while this trip's multiply
    f0 = _fragment(packed, tile_row, warp, lane, False)
    f1 = _fragment(packed, tile_row, warp + warps, lane, False)
    f2 = _fragment(packed, tile_row, warp + 2 * warps, lane, False)
    f3 = _fragment(packed, tile_row, warp + 3 * warps, lane, False)
    for kt in range(warp, ntiles, stride):
        nk = kt + stride if kt + stride < ntiles else kt
        n0 = _fragment(packed, tile_row, nk, lane, False)
        n1 = _fragment(packed, tile_row, nk + warps, lane, False)
        n2 = _fragment(packed, tile_row, nk + 2 * warps, lane, False)
        n3 = _fragment(packed, tile_row, nk + 3 * warps, lane, False)
        col = 2 * (lane % 4)
        a0, a1, a2, a3 = f0
        c0, c1, c2, c3 = _group(x, r, imin(kt, last) * 16 + col, a0, a1, a2, a3, c0, c1, c2, c3,
                                x_bf16, False, x, inv)  # fmt: skip
        a0, a1, a2, a3 = f1
        c0, c1, c2, c3 = _group(x, r, imin(kt + warps, last) * 16 + col, a0, a1, a2, a3,
                                c0, c1, c2, c3, x_bf16, False, x, inv)  # fmt: skip
        a0, a1, a2, a3 = f2
        c0, c1, c2, c3 = _group(x, r, imin(kt + 2 * warps, last) * 16 + col, a0, a1, a2, a3,
                                c0, c1, c2, c3, x_bf16, False, x, inv)  # fmt: skip
        a0, a1, a2, a3 = f3
        c0, c1, c2, c3 = _group(x, r, imin(kt + 3 * warps, last) * 16 + col, a0, a1, a2, a3,
                                c0, c1, c2, c3, x_bf16, False, x, inv)  # fmt: skip
        f0, f1, f2, f3 = n0, n1, n2, n3
    partial[warp, 0, lane] = c0
    partial[warp, 1, lane] = c1
    partial[warp, 2, lane] = c2
    partial[warp, 3, lane] = c3
    cuda.syncthreads()
    # the block's 128 sums, each the warps' partials added in warp order (linear_mma's order)
    for i_src in range(cuda.threadIdx.x, 4 * 32, warps * 32):
        i, src = i_src // 32, i_src % 32  # accumulator i of lane src
        slot = 2 * (src % 4) + i % 2  # the mma column: the tile's pair
        if slot < cnt:
            s = partial[0, i, src]
            for w in range(1, warps):
                s += partial[w, i, src]
            out[order[first + slot], col0 + 16 * nt + src // 4 + 8 * (i // 2)] = s


def _kernel(warps, x_bf16):
    registers = _WIDE_REGISTERS if warps == WIDE_WARPS else _REGISTERS

    @cuda.jit(cache=True, **registers)
    def kernel(x, order, es, ts, packed, num_experts, k, per_token, col0, out):
        grid_dependency_sync()
        partial = cuda.shared.array((warps, 4, 32), float32)
        _experts_mma_block(x, order, es, ts, packed, num_experts, k, per_token, col0, out,
                           warps, x_bf16, partial)  # fmt: skip

    return kernel


# (wide, x_bf16) -> kernel; each compiles on its first launch
_KERNELS = {
    (wide, x_bf16): _kernel(WIDE_WARPS if wide else WARPS, x_bf16)
    for wide in (False, True)
    for x_bf16 in (False, True)
}


def experts_mma(x, ids, groups, w: PackedExperts, col0: int, out, stream) -> None:
    """Launches the kernel over arguments the public launcher (moe.expert_linear) checked;
    groups: (order, expert_start, tile_start) grouped in tiles of PAIRS_PER_TILE."""
    if not aligned(x, 8):
        raise ValueError("expert_linear: x must start on an 8-byte boundary (64-bit loads)")
    check("expert_linear", "packed experts", w.data, np.uint32, 2)
    t, k = ids.shape
    pairs = t * k
    tiles = min(pairs, pairs // PAIRS_PER_TILE + w.num_experts)  # at most; the rest exit
    order, es, ts = groups
    kernel = _KERNELS[w.slices != WARPS, w.x_bf16]
    grid = (tiles, w.n // 16)  # x: 2^31 - 1 blocks, more than any step's pairs
    per_token = x.shape[0] == t
    kernel[grid, w.slices * 32, stream](
        x, order, es, ts, w.data, w.num_experts, k, per_token, col0, out
    )
