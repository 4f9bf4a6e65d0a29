"""Paged attention split over keys (flash-decoding), bitwise the same however it is launched.
Hot path: keep it lean.

A block serves one query token and one kv head, so the GQA group's query heads (G <= MAX_GROUP)
share every K and V load. Keys are cut into splits of SPLIT positions; inside a split, warp w
takes keys w, w + WARPS, ... with one coalesced load of the K row and one of the V row per key
(lane l holds dims l, l + 32, ...), one warp reduction per query head for q . k, and an online
softmax. A split's state (max m, sum l, acc) is the in-order fold of its warps' states, and
the row's result the in-order fold of its splits' states, always through `_fold`:
  - decode (`scratch` given, T <= its rows): splits spread over blocks (about TARGET_BLOCKS
    in all), partial states to scratch, then `_combine_kernel` folds them in split order: the
    GPU is filled even at batch 1;
  - otherwise (prefill): one block walks all splits of its row and folds them as it goes.
Both paths run the same code on the same keys in the same order, so a token's output does not
depend on the path, the batch or the chunking (the depth-2 law needs that on the GPU too).
"""

import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._device import NEG_INF, fmax, imin, warp_sum
from vtllm.kernels.cuda.attention import _sequence_of

SPLIT = 64  # keys per split
WARPS = 4
THREADS = 32 * WARPS
MAX_GROUP = 8  # query heads per kv head
MAX_DIM = 128  # head_dim (lane l holds dims l, l + 32, l + 64, l + 96)
PER_LANE = MAX_DIM // 32
TARGET_BLOCKS = 1024  # decode grid size to aim for (the H200 has 132 SMs)


def splits_for(max_positions: int) -> int:
    return -(-max_positions // SPLIT)


@cuda.jit(device=True)
def _fold(m, l, a, m2, l2, a2):
    """(m, l, a) merged with (m2, l2, a2); a state with m = -inf is empty."""
    if m2 == NEG_INF:
        return m, l, a
    if m == NEG_INF:
        return m2, l2, a2
    top = fmax(m, m2)
    c1 = math.exp(m - top)
    c2 = math.exp(m2 - top)
    return top, l * c1 + l2 * c2, a * c1 + a2 * c2


@cuda.jit(device=True)
def _row(query_start_loc, seq_lens, block_tables, t, bs):
    """(sequence, keys this query sees) for token row t, or (-1, 0) when the row is padding or
    its metadata does not fit the block table."""
    s = _sequence_of(query_start_loc, t)
    if s < 0:
        return -1, 0
    n_q = query_start_loc[s + 1] - query_start_loc[s]
    ctx = seq_lens[s]
    if ctx < n_q or (ctx + bs - 1) // bs > block_tables.shape[1]:
        return -1, 0
    return s, ctx - (query_start_loc[s + 1] - t) + 1


@cuda.jit(cache=True)
def _split_kernel(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out,
                  part_acc, part_ml, to_scratch):  # fmt: skip
    t, hk, z, nz = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z, cuda.gridDim.z
    tid = cuda.threadIdx.x
    w, lane = tid // 32, tid % 32
    num_blocks, bs, Hk, D = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2], q.shape[2]
    G = q.shape[1] // Hk
    s, n_keys = _row(query_start_loc, seq_lens, block_tables, t, bs)
    n_splits = (n_keys + SPLIT - 1) // SPLIT
    if s < 0 or z >= n_splits:
        return
    ok = 1
    for b in range(tid, (n_keys + bs - 1) // bs, THREADS):
        e = block_tables[s, b]
        if e < 0 or e >= num_blocks:
            ok = 0
    if cuda.syncthreads_and(ok) == 0:
        return
    qr = cuda.local.array((MAX_GROUP, PER_LANE), float32)
    for g in range(G):
        for i in range(PER_LANE):
            d = lane + 32 * i
            qr[g, i] = q[t, hk * G + g, d] * scale if d < D else np.float32(0.0)
    sm_m = cuda.shared.array((WARPS, MAX_GROUP), float32)
    sm_l = cuda.shared.array((WARPS, MAX_GROUP), float32)
    sm_acc = cuda.shared.array((WARPS, MAX_GROUP, MAX_DIM), float32)
    run_m = cuda.shared.array(MAX_GROUP, float32)
    run_l = cuda.shared.array(MAX_GROUP, float32)
    run_acc = cuda.shared.array((MAX_GROUP, MAX_DIM), float32)
    new_m = cuda.local.array(MAX_GROUP, float32)
    new_l = cuda.local.array(MAX_GROUP, float32)
    wm = cuda.local.array(MAX_GROUP, float32)
    wl = cuda.local.array(MAX_GROUP, float32)
    wacc = cuda.local.array((MAX_GROUP, PER_LANE), float32)
    kr = cuda.local.array(PER_LANE, float32)
    vr = cuda.local.array(PER_LANE, float32)
    for g in range(G):
        if tid < D:
            run_acc[g, tid] = 0.0
        if tid == 0:
            run_m[g] = NEG_INF
            run_l[g] = 0.0
    cuda.syncthreads()
    for sp in range(z, n_splits, nz):
        lo = sp * SPLIT
        hi = imin(n_keys, lo + SPLIT)
        for g in range(G):
            wm[g] = NEG_INF
            wl[g] = 0.0
            for i in range(PER_LANE):
                wacc[g, i] = 0.0
        for j0 in range(lo, hi, WARPS):  # block-uniform trip count: every warp reduces alike
            j = j0 + w
            valid = j < hi
            if valid:
                blk, off = block_tables[s, j // bs], j % bs
                for i in range(PER_LANE):
                    d = lane + 32 * i
                    kr[i] = k_cache[blk, off, hk, d] if d < D else np.float32(0.0)
                    vr[i] = v_cache[blk, off, hk, d] if d < D else np.float32(0.0)
            for g in range(G):
                part = np.float32(0.0)
                for i in range(PER_LANE):
                    part += qr[g, i] * kr[i] if valid else np.float32(0.0)
                score = warp_sum(part)
                if valid:
                    top = fmax(wm[g], score)
                    c = math.exp(wm[g] - top)
                    p = math.exp(score - top)
                    wl[g] = wl[g] * c + p
                    for i in range(PER_LANE):
                        wacc[g, i] = wacc[g, i] * c + p * vr[i]
                    wm[g] = top
        for g in range(G):
            if lane == 0:
                sm_m[w, g] = wm[g]
                sm_l[w, g] = wl[g]
            for i in range(PER_LANE):
                d = lane + 32 * i
                if d < D:
                    sm_acc[w, g, d] = wacc[g, i]
        cuda.syncthreads()
        for g in range(G):
            m, l, a = NEG_INF, np.float32(0.0), np.float32(0.0)
            for ww in range(WARPS):
                m, l, a = _fold(m, l, a, sm_m[ww, g], sm_l[ww, g],
                                sm_acc[ww, g, tid] if tid < D else np.float32(0.0))  # fmt: skip
            h = hk * G + g
            if to_scratch:
                if tid < D:
                    part_acc[t, h, sp, tid] = a
                if tid == 0:
                    part_ml[t, h, sp, 0] = m
                    part_ml[t, h, sp, 1] = l
            else:
                new_m[g], new_l[g], a = _fold(run_m[g], run_l[g],
                                              run_acc[g, tid] if tid < D else np.float32(0.0),
                                              m, l, a)  # fmt: skip
                if tid < D:
                    run_acc[g, tid] = a
        cuda.syncthreads()  # every thread has read run_m / run_l and the warps' states
        if tid == 0 and not to_scratch:
            for g in range(G):
                run_m[g] = new_m[g]
                run_l[g] = new_l[g]
        cuda.syncthreads()
    if not to_scratch and tid < D:
        for g in range(G):
            out[t, hk * G + g, tid] = run_acc[g, tid] / run_l[g]


@cuda.jit(cache=True)
def _combine_kernel(part_acc, part_ml, block_tables, seq_lens, query_start_loc, bs, out):
    t, h, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    s, n_keys = _row(query_start_loc, seq_lens, block_tables, t, bs)
    if s < 0 or tid >= out.shape[2]:
        return
    m, l, a = NEG_INF, np.float32(0.0), np.float32(0.0)
    for sp in range((n_keys + SPLIT - 1) // SPLIT):
        m, l, a = _fold(m, l, a, part_ml[t, h, sp, 0], part_ml[t, h, sp, 1],
                        part_acc[t, h, sp, tid])  # fmt: skip
    out[t, h, tid] = a / l


def supports(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    return head_dim <= MAX_DIM and num_heads // num_kv_heads <= MAX_GROUP


def make_scratch(rows: int, num_heads: int, head_dim: int, max_positions: int, *, stream=0):
    """Partial states for the one-block-per-split path: rows x heads x splits."""
    n = splits_for(max_positions)
    return (
        cuda.device_array((rows, num_heads, n, head_dim), np.float32, stream=stream),
        cuda.device_array((rows, num_heads, n, 2), np.float32, stream=stream),
    )


def split_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out,
                    scratch, *, stream=0) -> None:  # fmt: skip
    """As attention.paged_attention (its launcher has checked the arguments); scratch is
    make_scratch's pair or None."""
    T, Hq, D = q.shape
    Hk, bs = k_cache.shape[2], k_cache.shape[1]
    if (
        scratch is not None
        and T <= scratch[0].shape[0]
        and scratch[0].shape[1:] == (Hq, scratch[0].shape[2], D)
    ):
        part_acc, part_ml = scratch[0][:T], scratch[1][:T]
        # enough blocks to fill the GPU, each looping over splits z, z + nz, ...: with one block
        # per split of the longest context, a batch of short rows launches mostly empty blocks
        nz = min(part_acc.shape[2], max(1, -(-TARGET_BLOCKS // (T * Hk))))
        grid = (T, Hk, nz)
        _split_kernel[grid, THREADS, stream](q, k_cache, v_cache, block_tables, seq_lens,
                                             query_start_loc, np.float32(scale), out, part_acc,
                                             part_ml, True)  # fmt: skip
        _combine_kernel[(T, Hq), max(32, -(-D // 32) * 32), stream](
            part_acc, part_ml, block_tables, seq_lens, query_start_loc, bs, out
        )
        return
    dummy = scratch if scratch is not None else _dummy()
    _split_kernel[(T, Hk, 1), THREADS, stream](q, k_cache, v_cache, block_tables, seq_lens,
                                               query_start_loc, np.float32(scale), out,
                                               dummy[0], dummy[1], False)  # fmt: skip


_dummies: list = []


def _dummy():
    if not _dummies:
        _dummies.append(make_scratch(1, 1, 1, 1))
    return _dummies[0]
