"""The router's top-k and the experts' combine on the GPU, with kernels/cpu/moe's semantics.
Hot path: keep it lean.

route: one thread per token. The softmax runs in float64 and is rounded once (the float32
probabilities closest to exact, as the CPU kernel computes them), then k passes of argmax with
strict > over ascending experts, so ties go to the lower index. The probabilities overwrite
the logits row in place and a taken expert's is set to TAKEN (probabilities are never
negative): no scratch per token, whatever the expert count. A row of NaN (a padded row of a
graph step) still picks k distinct experts, 0 .. k-1, so the GEMV that follows reads no
expert outside the layer.
group: the (token, rank) pairs p = t * k + r sorted by expert for the experts' kernels
(_moe_gemv, _moe_mma), in one block: counts per expert, their prefix sums (where each expert's
run of pairs starts in `order`, and where its tiles of per_tile pairs start: PAIRS_PER_TILE for
the GEMV, _moe_mma's eight for the tensor cores), then each pair placed in its expert's run.
The places come from atomics, so the order within a run varies from step to step; no result
depends on it (both kernels compute each pair on its own).
combine: out[t] = sum over r, in rank order, of weights[t, r] * ys[t * k + r]: the first
product, then one fused multiply-add per rank (kernels/cpu/moe.combine's order).
"""

import math

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR, fma32, fmax, imin
from vtllm.kernels.cuda._ptx import grid_dependency_sync

ROUTE_THREADS = 32 if SIMULATOR else 128
COMBINE_THREADS = 32 if SIMULATOR else 256
MAX_BLOCKS = 4 if SIMULATOR else 4096  # the combine's grid-stride loop covers the rest
TAKEN = np.float32(-1.0)
GROUP_THREADS = 32 if SIMULATOR else 1024
PAIRS_PER_TILE = 4  # pairs of one expert a GEMV block takes at once (its four accumulators)


@cuda.jit(cache=True)
def _route_kernel(logits, renormalize, ids, weights):
    grid_dependency_sync()
    t = cuda.grid(1)
    if t >= logits.shape[0]:
        return
    num_experts, k = logits.shape[1], ids.shape[1]
    top = -math.inf
    for e in range(num_experts):
        top = fmax(top, np.float64(logits[t, e]))
    total = 0.0
    for e in range(num_experts):
        total += math.exp(np.float64(logits[t, e]) - top)
    for e in range(num_experts):
        logits[t, e] = np.float32(math.exp(np.float64(logits[t, e]) - top) / total)
    kept = np.float32(0.0)
    for r in range(k):
        best = -1
        for e in range(num_experts):
            p = logits[t, e]
            if p != TAKEN and (best < 0 or p > logits[t, best]):
                best = e
        w = logits[t, best]
        ids[t, r] = best
        weights[t, r] = w
        kept += w
        logits[t, best] = TAKEN
    if renormalize:
        for r in range(k):
            weights[t, r] = weights[t, r] / kept


@cuda.jit(cache=True)
def _group_kernel(ids, num_experts, per_tile, fill, expert_start, tile_start, order):
    grid_dependency_sync()
    tid, threads = cuda.threadIdx.x, cuda.blockDim.x
    k = ids.shape[1]
    pairs = ids.shape[0] * k
    for e in range(tid, num_experts, threads):
        fill[e] = 0
    cuda.syncthreads()
    for p in range(tid, pairs, threads):
        cuda.atomic.add(fill, _expert(ids, p, k, num_experts), 1)
    cuda.syncthreads()
    if tid == 0:  # E <= a few hundred: one thread's prefix sums cost less than a scan's syncs
        run = tiles = 0
        for e in range(num_experts):
            count = fill[e]
            expert_start[e] = run
            tile_start[e] = tiles
            fill[e] = run
            run += count
            tiles += (count + per_tile - 1) // per_tile
        expert_start[num_experts] = run
        tile_start[num_experts] = tiles
    cuda.syncthreads()
    for p in range(tid, pairs, threads):
        order[cuda.atomic.add(fill, _expert(ids, p, k, num_experts), 1)] = p


@cuda.jit(device=True)
def tile_pairs(j, expert_start, tile_start, num_experts, per_tile):
    """Tile j of group's layout (tiles of per_tile pairs): its expert, the place of its first
    pair in order, and its number of pairs."""
    lo, hi = 0, num_experts - 1  # the last expert whose tiles start at or before j
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tile_start[mid] <= j:
            lo = mid
        else:
            hi = mid - 1
    first = expert_start[lo] + per_tile * (j - tile_start[lo])
    return lo, first, imin(per_tile, expert_start[lo + 1] - first)


@cuda.jit(device=True)
def _expert(ids, p, k, num_experts):
    """Pair p's expert, clamped: padded rows of a graph step must not send the GEMV outside
    the layer's experts, whatever their ids hold."""
    t = p // k
    e = ids[t, p - t * k]
    return 0 if e < 0 else imin(e, num_experts - 1)


@cuda.jit(cache=True)
def _combine_kernel(ys, weights, accumulate, out):
    grid_dependency_sync()
    k, hidden = weights.shape[1], out.shape[1]
    for j in range(cuda.grid(1), out.shape[0] * hidden, cuda.gridsize(1)):
        t, i = j // hidden, j % hidden
        row = t * k
        s = weights[t, 0] * ys[row, i]
        for r in range(1, k):
            s = fma32(weights[t, r], ys[row + r, i], s)
        out[t, i] = out[t, i] + s if accumulate else s


def route(logits, renormalize: bool, ids, weights, stream) -> None:
    t = logits.shape[0]
    blocks = -(-t // ROUTE_THREADS)
    _route_kernel[blocks, ROUTE_THREADS, stream](logits, renormalize, ids, weights)


def group(ids, num_experts: int, per_tile: int, fill, expert_start, tile_start, order, stream):
    _group_kernel[1, GROUP_THREADS, stream](
        ids, num_experts, per_tile, fill, expert_start, tile_start, order
    )


def combine(ys, weights, accumulate: bool, out, stream) -> None:
    total = out.shape[0] * out.shape[1]
    blocks = min(MAX_BLOCKS, -(-total // COMBINE_THREADS))
    _combine_kernel[blocks, COMBINE_THREADS, stream](ys, weights, accumulate, out)
