"""The routed experts' GEMV: out[p] = x[row(p)] @ W_e.T for each (token, rank) pair p = t * k + r
of a step, e = ids[t, r] read on the device (so a captured graph replays any routing). Hot
path: keep it lean.

The experts of a layer are one matrix [E * N, cols] (expert e's rows at e * N ..), so row
e * N + n is an ordinary row of W and the per-lane decode device functions of the dense GEMVs
(_linear: float words and Q4_0 / Q4_1 / Q8_0 blocks; _linear_kquant: K-quant super-blocks and
Q5 blocks) read it unchanged. The grid is (rows of W / WARPS, pairs): a warp per row n and
one pair per block row at a time (blocks loop over pairs past the grid's y limit), every warp
of a block on the same pair (the simulator's warp sum is a block barrier). A pair's output is
thus one fixed sequence of operations on its own row of x and its expert's rows: its bits
never depend on the step's other tokens or their experts.
row(p) is t where x holds one row per token (gate/up over the normed hidden states), p where
it holds one per pair (down over the activations).

Each pair reads its expert's rows on its own: pairs of a batch that share an expert read them
again (a grouped kernel over expert-sorted pairs would read them once; not written yet).
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
    warp_sum,
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
from vtllm.kernels.cuda._ptx import grid_dependency_sync

WARPS = 2 if SIMULATOR else 4  # rows of W per block, one warp each
MAX_GRID_Y = 65535  # the grid's y limit: blocks loop over pairs past it
_Z = np.float32(0.0)


@cuda.jit(device=True)
def _pair_row(ids, p, num_experts, n_rows, per_token):
    """(pair p's row of x, this warp's output row n, its row of the stacked W)."""
    k = ids.shape[1]
    t = p // k
    # clamped: padded rows of a graph step must not read outside W, whatever their ids hold
    e = ids[t, p - t * k]
    e = 0 if e < 0 else imin(e, num_experts - 1)
    n = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    return t if per_token else p, n, e * n_rows + imin(n, n_rows - 1)


@cuda.jit(device=True)
def _store(out, col0, p, n, n_rows, lane, a):
    a = warp_sum(a)
    if lane == 0 and n < n_rows:
        out[p, col0 + n] = a


@cuda.jit(cache=True)
def _experts_vec_kernel(x, ids, w, qt, num_experts, n_rows, per_token, col0, out):
    """F32 / F16 / BF16 rows as 64-bit words (_linear._word: 2 or 4 weights a word)."""
    grid_dependency_sync()
    lane = cuda.threadIdx.x % 32
    for p in range(cuda.blockIdx.y, ids.shape[0] * ids.shape[1], cuda.gridDim.y):
        xr, n, r = _pair_row(ids, p, num_experts, n_rows, per_token)
        per = 2 if qt == F32 else 4
        words = w.shape[1]
        a = _Z
        c = lane
        while c + 32 < words:  # two words per lane in flight
            u = w[r, c]
            v = w[r, c + 32]
            a, _, _, _ = _word(x, xr, xr, xr, xr, True, u, c * per, qt, a, _Z, _Z, _Z)
            a, _, _, _ = _word(x, xr, xr, xr, xr, True, v, (c + 32) * per, qt, a, _Z, _Z, _Z)
            c += 64
        if c < words:
            a, _, _, _ = _word(x, xr, xr, xr, xr, True, w[r, c], c * per, qt, a, _Z, _Z, _Z)
        _store(out, col0, p, n, n_rows, lane, a)


@cuda.jit(cache=True)
def _experts_float_kernel(x, ids, w, qt, num_experts, n_rows, per_token, col0, out):
    """Float rows that are not 8-byte words (odd widths): one weight a lane a step."""
    grid_dependency_sync()
    lane = cuda.threadIdx.x % 32
    for p in range(cuda.blockIdx.y, ids.shape[0] * ids.shape[1], cuda.gridDim.y):
        xr, n, r = _pair_row(ids, p, num_experts, n_rows, per_token)
        a = _Z
        for k in range(lane, x.shape[1], 32):
            a += x[xr, k] * float_weight(w, r, k, qt)
        _store(out, col0, p, n, n_rows, lane, a)


@cuda.jit(cache=True)
def _experts_quant_kernel(x, ids, w, qt, num_experts, n_rows, per_token, col0, out):
    """Q4_0 / Q4_1 / Q8_0: four lanes a 32-weight block, as _linear's quant kernel walks it."""
    grid_dependency_sync()
    lane = cuda.threadIdx.x % 32
    for p in range(cuda.blockIdx.y, ids.shape[0] * ids.shape[1], cuda.gridDim.y):
        xr, n, r = _pair_row(ids, p, num_experts, n_rows, per_token)
        sub = lane % 4
        a = _Z
        for b in range(lane // 4, x.shape[1] // QK, 8):
            c = b * QK
            if qt == Q8_0:
                h = b * (BB_Q8_0 // 2)
                d = f16_to_f32(w[r, h])
                for e in range(4):
                    word = np.int32(w[r, h + 1 + 4 * sub + e])
                    k = c + 8 * sub + 2 * e
                    a, _, _, _ = _q8_word(x, xr, xr, xr, xr, True, word, k, d, a, _Z, _Z, _Z)
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
                for e in range(2):
                    word = np.int32(w[r, body + 2 * sub + e])
                    j = 4 * sub + 2 * e
                    a, _, _, _ = _q4_word(
                        x, xr, xr, xr, xr, True, word, c, j, d, mn, qt, a, _Z, _Z, _Z
                    )
        _store(out, col0, p, n, n_rows, lane, a)


@cuda.jit(cache=True)
def _experts_kquant_kernel(x, ids, w, qt, num_experts, n_rows, per_token, col0, out):
    """Q2_K .. Q6_K and Q5_0 / Q5_1: _linear_kquant's per-lane units."""
    grid_dependency_sync()
    lane = cuda.threadIdx.x % 32
    for p in range(cuda.blockIdx.y, ids.shape[0] * ids.shape[1], cuda.gridDim.y):
        xr, n, r = _pair_row(ids, p, num_experts, n_rows, per_token)
        K = x.shape[1]
        a = _Z
        if qt == Q5_0 or qt == Q5_1:
            for blk in range(lane // 4, K // 32, 8):
                a, _, _, _ = _block_q5(
                    x, xr, xr, xr, xr, True, w, r, qt, blk, lane % 4, a, _Z, _Z, _Z
                )
        else:
            for b in range(K // QK_K):
                if qt == Q4_K or qt == Q5_K:
                    a, _, _, _ = _unit_q45k(
                        x, xr, xr, xr, xr, True, w, r, qt, b, lane, a, _Z, _Z, _Z
                    )
                elif qt == Q6_K:
                    a, _, _, _ = _unit_q6k(x, xr, xr, xr, xr, True, w, r, b, lane, a, _Z, _Z, _Z)
                else:
                    a, _, _, _ = _unit_q23k(
                        x, xr, xr, xr, xr, True, w, r, qt, b, lane, a, _Z, _Z, _Z
                    )
        _store(out, col0, p, n, n_rows, lane, a)


def experts_gemv(kernel, x, ids, wv, qt, num_experts, per_token, col0, out, stream) -> None:
    """Launches kernel (one of this module's, for wv's type) over arguments the public
    launcher (moe.expert_linear) has checked."""
    n_rows = wv.shape[0] // num_experts
    pairs = ids.shape[0] * ids.shape[1]
    grid = (-(-n_rows // WARPS), min(pairs, MAX_GRID_Y))
    kernel[grid, WARPS * 32, stream](x, ids, wv, qt, num_experts, n_rows, per_token, col0, out)


KERNELS = {
    "vec": _experts_vec_kernel,
    "float": _experts_float_kernel,
    "quant": _experts_quant_kernel,
    "kquant": _experts_kquant_kernel,
}
