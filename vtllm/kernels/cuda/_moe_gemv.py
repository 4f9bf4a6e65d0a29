"""The routed experts' GEMV: out[p] = x[row(p)] @ W_e.T for each (token, rank) pair p = t * k + r
of a step, e = ids[t, r] read on the device (so a captured graph replays any routing). Hot
path: keep it lean.

The experts of a layer are one matrix [E * N, cols] (expert e's rows at e * N ..), so row
e * N + n is an ordinary row of W and the per-lane decode device functions of the dense GEMVs
(_linear: float words and Q4_0 / Q4_1 / Q8_0 blocks; _linear_kquant: K-quant super-blocks and
Q5 blocks) read it unchanged. The pairs come grouped by expert (_moe_route.group) in tiles of
up to four pairs of one expert; the grid is (rows of W / WARPS, tiles): a warp per row n, one
tile per block row at a time (blocks loop over tiles past the grid's y limit), every warp of a
block on the same tile (the simulator's warp sum is a block barrier). A tile reads its
expert's rows once for its pairs, each pair in an accumulator of its own, the sequence of
operations the dense GEMV gives a row of x whatever rows share its block (its rows are
independent of M): a pair's bits never depend on the step's other tokens, on which pairs
share its tile, or on the order the grouping placed them in. row(p) is t where x holds one
row per token (gate/up over the normed hidden states), p where it holds one per pair (down
over the activations).
"""

import numpy as np
from numba import cuda

from vtllm.kernels import QK_K
from vtllm.kernels.cuda._device import (
    BB_Q4_0,
    BB_Q4_1,
    BB_Q8_0,
    F32,
    Q4_0,
    Q8_0,
    QK,
    SIMULATOR,
    f16_to_f32,
    float_weight,
    imin,
    warp_sum4,
)
from vtllm.kernels.cuda._linear import _q4_word, _q8_word, _word
from vtllm.kernels.cuda._linear_kquant import (
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    _block_q5,
    _unit_q6k,
    _unit_q23k,
    _unit_q45k,
)
from vtllm.kernels.cuda._moe_route import PAIRS_PER_TILE, tile_pairs
from vtllm.kernels.cuda._ptx import grid_dependency_sync

WARPS = 2 if SIMULATOR else 4  # rows of W per block, one warp each
MAX_GRID_Y = 65535  # the grid's y limit: blocks loop over tiles past it
_Z = np.float32(0.0)


@cuda.jit(device=True)
def _tile(j, expert_start, tile_start, order, num_experts, k, per_token):
    """Tile j: (its expert, its number of pairs, the pairs, their rows of x); slots past the
    count repeat the last pair (computed, never stored)."""
    lo, first, cnt = tile_pairs(j, expert_start, tile_start, num_experts, PAIRS_PER_TILE)
    p0 = order[first]
    p1 = order[first + imin(1, cnt - 1)]
    p2 = order[first + imin(2, cnt - 1)]
    p3 = order[first + imin(3, cnt - 1)]
    if per_token:
        return lo, cnt, p0, p1, p2, p3, p0 // k, p1 // k, p2 // k, p3 // k
    return lo, cnt, p0, p1, p2, p3, p0, p1, p2, p3


@cuda.jit(device=True)
def _store(out, col0, n, n_rows, lane, cnt, p0, p1, p2, p3, a0, a1, a2, a3):
    a0, a1, a2, a3 = warp_sum4(a0, a1, a2, a3)
    if lane == 0 and n < n_rows:
        c = col0 + n
        out[p0, c] = a0
        if cnt > 1:
            out[p1, c] = a1
        if cnt > 2:
            out[p2, c] = a2
        if cnt > 3:
            out[p3, c] = a3


@cuda.jit(cache=True)
def _experts_vec_kernel(x, order, es, ts, w, qt, num_experts, n_rows, k, per_token, col0, out):
    """F32 / F16 / BF16 rows as 64-bit words (_linear._word: 2 or 4 weights a word)."""
    grid_dependency_sync()
    lane = cuda.threadIdx.x % 32
    n = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    per = 2 if qt == F32 else 4
    words = w.shape[1]
    for j in range(cuda.blockIdx.y, ts[num_experts], cuda.gridDim.y):
        e, cnt, p0, p1, p2, p3, x0, x1, x2, x3 = _tile(j, es, ts, order, num_experts, k, per_token)
        one = cnt == 1
        r = e * n_rows + imin(n, n_rows - 1)
        a0 = a1 = a2 = a3 = _Z
        c = lane
        while c + 32 < words:  # two words per lane in flight
            u = w[r, c]
            v = w[r, c + 32]
            a0, a1, a2, a3 = _word(x, x0, x1, x2, x3, one, u, c * per, qt, a0, a1, a2, a3)
            a0, a1, a2, a3 = _word(x, x0, x1, x2, x3, one, v, (c + 32) * per, qt, a0, a1, a2, a3)
            c += 64
        if c < words:
            a0, a1, a2, a3 = _word(x, x0, x1, x2, x3, one, w[r, c], c * per, qt, a0, a1, a2, a3)
        _store(out, col0, n, n_rows, lane, cnt, p0, p1, p2, p3, a0, a1, a2, a3)


@cuda.jit(cache=True)
def _experts_float_kernel(x, order, es, ts, w, qt, num_experts, n_rows, k, per_token, col0, out):
    """Float rows that are not 8-byte words (odd widths): one weight a lane a step."""
    grid_dependency_sync()
    lane = cuda.threadIdx.x % 32
    n = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    for j in range(cuda.blockIdx.y, ts[num_experts], cuda.gridDim.y):
        e, cnt, p0, p1, p2, p3, x0, x1, x2, x3 = _tile(j, es, ts, order, num_experts, k, per_token)
        r = e * n_rows + imin(n, n_rows - 1)
        a0 = a1 = a2 = a3 = _Z
        for kk in range(lane, x.shape[1], 32):
            wv = float_weight(w, r, kk, qt)
            a0 += x[x0, kk] * wv
            a1 += x[x1, kk] * wv
            a2 += x[x2, kk] * wv
            a3 += x[x3, kk] * wv
        _store(out, col0, n, n_rows, lane, cnt, p0, p1, p2, p3, a0, a1, a2, a3)


@cuda.jit(cache=True)
def _experts_quant_kernel(x, order, es, ts, w, qt, num_experts, n_rows, k, per_token, col0, out):
    """Q4_0 / Q4_1 / Q8_0: four lanes a 32-weight block, as _linear's quant kernel walks it."""
    grid_dependency_sync()
    lane = cuda.threadIdx.x % 32
    n = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    sub = lane % 4
    for j in range(cuda.blockIdx.y, ts[num_experts], cuda.gridDim.y):
        e, cnt, p0, p1, p2, p3, x0, x1, x2, x3 = _tile(j, es, ts, order, num_experts, k, per_token)
        one = cnt == 1
        r = e * n_rows + imin(n, n_rows - 1)
        a0 = a1 = a2 = a3 = _Z
        for b in range(lane // 4, x.shape[1] // QK, 8):
            c = b * QK
            if qt == Q8_0:
                h = b * (BB_Q8_0 // 2)
                d = f16_to_f32(w[r, h])
                for i in range(4):
                    word = np.int32(w[r, h + 1 + 4 * sub + i])
                    kk = c + 8 * sub + 2 * i
                    a0, a1, a2, a3 = _q8_word(x, x0, x1, x2, x3, one, word, kk, d, a0, a1, a2, a3)
            else:
                if qt == Q4_0:
                    h = b * (BB_Q4_0 // 2)
                    mn = _Z
                    body = h + 1
                else:
                    h = b * (BB_Q4_1 // 2)
                    mn = f16_to_f32(w[r, h + 1])
                    body = h + 2
                d = f16_to_f32(w[r, h])
                for i in range(2):
                    word = np.int32(w[r, body + 2 * sub + i])
                    jj = 4 * sub + 2 * i
                    a0, a1, a2, a3 = _q4_word(
                        x, x0, x1, x2, x3, one, word, c, jj, d, mn, qt, a0, a1, a2, a3
                    )
        _store(out, col0, n, n_rows, lane, cnt, p0, p1, p2, p3, a0, a1, a2, a3)


@cuda.jit(cache=True)
def _experts_kquant_kernel(x, order, es, ts, w, qt, num_experts, n_rows, k, per_token, col0, out):
    """Q2_K .. Q6_K and Q5_0 / Q5_1: _linear_kquant's per-lane units."""
    grid_dependency_sync()
    lane = cuda.threadIdx.x % 32
    n = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    K = x.shape[1]
    for j in range(cuda.blockIdx.y, ts[num_experts], cuda.gridDim.y):
        e, cnt, p0, p1, p2, p3, x0, x1, x2, x3 = _tile(j, es, ts, order, num_experts, k, per_token)
        one = cnt == 1
        r = e * n_rows + imin(n, n_rows - 1)
        a0 = a1 = a2 = a3 = _Z
        if qt == Q5_0 or qt == Q5_1:
            for blk in range(lane // 4, K // 32, 8):
                a0, a1, a2, a3 = _block_q5(
                    x, x0, x1, x2, x3, one, w, r, qt, blk, lane % 4, a0, a1, a2, a3
                )
        else:
            for b in range(K // QK_K):
                if qt == Q4_K or qt == Q5_K:
                    a0, a1, a2, a3 = _unit_q45k(
                        x, x0, x1, x2, x3, one, w, r, qt, b, lane, a0, a1, a2, a3
                    )
                elif qt == Q6_K:
                    a0, a1, a2, a3 = _unit_q6k(
                        x, x0, x1, x2, x3, one, w, r, b, lane, a0, a1, a2, a3
                    )
                else:
                    a0, a1, a2, a3 = _unit_q23k(
                        x, x0, x1, x2, x3, one, w, r, qt, b, lane, a0, a1, a2, a3
                    )
        _store(out, col0, n, n_rows, lane, cnt, p0, p1, p2, p3, a0, a1, a2, a3)


def experts_gemv(kernel, x, ids, groups, wv, qt, num_experts, per_token, col0, out, stream):
    """Launches kernel (one of this module's, for wv's type) over arguments the public
    launcher (moe.expert_linear) has checked; groups: (order, expert_start, tile_start)."""
    n_rows = wv.shape[0] // num_experts
    pairs = ids.shape[0] * ids.shape[1]
    tiles = min(pairs, pairs // PAIRS_PER_TILE + num_experts)  # at most; the rest exit
    grid = (-(-n_rows // WARPS), min(tiles, MAX_GRID_Y))
    order, es, ts = groups
    k = ids.shape[1]
    kernel[grid, WARPS * 32, stream](
        x, order, es, ts, wv, qt, num_experts, n_rows, k, per_token, col0, out
    )


KERNELS = {
    "vec": _experts_vec_kernel,
    "float": _experts_float_kernel,
    "quant": _experts_quant_kernel,
    "kquant": _experts_kquant_kernel,
}
