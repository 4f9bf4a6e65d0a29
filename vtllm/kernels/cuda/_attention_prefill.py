"""Causal attention of a prefill step over the paged KV cache: _attention_split's bits, with one
load of each key split shared by a tile of ROWS (token, query head) rows and register tiles in
both products. Hot path: keep it lean.

_attention_split's decode kernel gives a block one token and one kv head; a prefill of n tokens
through it loads every split of K and V n times. Here a block owns one kv head and ROWS // G
consecutive tokens (G = Hq / Hk), so up to ROWS rows; the tokens of the tile that belong to one
sequence (a run) go through each split of SPLIT keys together, in three phases:
  1. load: the split's K and V into shared memory (warp w keys w, w + WARPS, ..., lane l dims
     4l .. 4l + 3, every load in flight before the first store);
  2. scores and softmax: thread (row group, key group) computes S_ROWS rows x S_KEYS keys of
     q . k, each 128-bit load of q serving S_KEYS keys and each load of k serving S_ROWS rows,
     then each row's max, p and sum of p among the row's eight key groups (consecutive
     lanes: three shuffles a reduction), with the bits of the decode kernel's warp_max and
     warp_sum over lane j = key j (octet_max4, octet_sum4). The softmax is part of this
     phase rather than one of its own, a warp a row, which would cost a barrier, a pass of
     the scores through shared memory and each warp's rows one after another, ten dependent
     shuffles each;
  3. p @ V: thread (row group, column group) sums V_ROWS rows x PIECES four-column pieces,
     each V load serving V_ROWS rows, folded into running states held in registers.
Per row and key, and per row and column, every sum runs in the decode kernel's order (its
_score: four partial sums over dims in order; its _weighted_columns: keys in order), and a
row's splits are folded in order as _attention_split._fold folds them (_fold_weights and
_fold_acc, whose two-product sums are pinned with fma32). A row whose causal window ends
before a split has no key in it: its state is empty (max -inf), and folding an empty state
returns the running one unchanged; keys loaded for a longer row of the run only add p = 0
terms past a row's last key, as the decode kernel's padding keys do. So a token's output has
the same bits whichever path computed it.

Variants (compiled apart, _prefill_kernel(masked, dim)): masked takes a window and a cap; a run
then starts at its first row's first window split, each row's keys before its own window score
-inf (a split wholly before it gives the row an empty state, which its fold keeps out), and the
split's loads read keys before the run's first window key as that key (split_loader). Wide
(heads of 256): tiles of half the rows (geometry).

Tiles are launched heaviest first (the last tokens of a prompt see the most keys), so the
long blocks do not start in the last wave. The working set (K, V, queries, scores: ~77 KB)
is dynamic shared memory: two blocks of 8 warps share an SM.

Limits (bench/gpu_attention.py --prefill; BENCHMARKS.md, Kernels): far slower than a
tensor-core attention (_attention_flash, or torch's SDPA), since it computes in float32 on
CUDA cores to keep the decode kernel's bits. A long prompt's tiles make about one wave whose
work grows with the tile (the last tokens see the most keys), so many SMs idle at its end,
and the busy ones wait on shared memory. The critical path is the heaviest tile's splits one
after another; splitting its keys over blocks needs their states folded in order
(_attention_split._fold), i.e. the decode path's scratch.

Over 400 lines: one kernel whose factory (~260 lines) holds its phase helpers, made per
variant since their tile constants differ (geometry); the split's loader and the fold live in
_attention_common.
"""

import functools
import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._attention_common import (
    KEEP_FIRST,
    MAX_DIM,
    MAX_GROUP,
    MIX,
    SPLIT,
    TAKE_SECOND,
    _fold_acc,
    _fold_weights,
    _sequence_of,
    block_shift,
    capped,
    dim_for,
    row_for,
    split_loader,
    window_start,
)
from vtllm.kernels.cuda._device import (
    NEG_INF,
    SIMULATOR,
    fmax,
    imin,
    octet_max4,
    octet_sum4,
    warp_max,
)
from vtllm.kernels.cuda._host import allow_dynamic_shared
from vtllm.kernels.cuda._ptx import grid_dependency_sync
from vtllm.kernels.cuda._ptx_shared import shared_f32x4

WARPS = 2 if SIMULATOR else 8
THREADS = 32 * WARPS
# scores: S_ROWS x S_KEYS per thread; the key group's keys are kg, kg + KEY_GROUPS, ..., so
# the eight key groups of a warp read eight consecutive K rows (no bank conflict: ROW % 32 = 4)
S_KEYS = 4
KEY_GROUPS = SPLIT // S_KEYS
assert S_KEYS == 4 and KEY_GROUPS == 8  # a row's keys are an octet's (octet_sum4)
# p @ V: V_ROWS rows x PIECES four-column pieces per thread, pieces cg and cg + COL_GROUPS, so
# the column groups of a quarter-warp read consecutive 16-byte pieces of a V row
PIECES = 2
P_ROW = SPLIT + 4  # score / probability row stride: rows V_ROWS apart fall on other banks
NO_BAD = np.float32(1 << 24)
_REGISTERS = {} if SIMULATOR else {"max_registers": 128}  # two blocks of 256 threads an SM


def geometry(dim: int) -> dict:
    """A tile's shape and its dynamic shared array's regions (every offset a multiple of 4
    floats) for heads of up to dim dims. Narrow: S_ROWS = 2 score rows a thread, ROWS = 64
    rows a tile (16 in the simulator), ~77 KB. Wide (WIDE_DIM): one score row a thread and
    half the rows, so that the queries and the split (~105 KB) still let two blocks share an
    SM, and the p @ V registers stay the narrow tile's."""
    g = {"row": row_for(dim), "s_rows": 2 if dim == MAX_DIM else 1}
    g["rows"] = THREADS // KEY_GROUPS * g["s_rows"]  # rows of a tile
    g["col_groups"] = dim // 4 // PIECES
    g["v_rows"] = g["rows"] // (THREADS // g["col_groups"])
    assert KEY_GROUPS * (g["rows"] // g["s_rows"]) == THREADS and g["rows"] >= MAX_GROUP
    assert g["col_groups"] * (g["rows"] // g["v_rows"]) == THREADS
    row, rows = g["row"], g["rows"]
    g["k"] = 0  # the split's keys [SPLIT, row]
    g["v"] = g["k"] + SPLIT * row  # and values
    g["q"] = g["v"] + SPLIT * row  # scaled queries [rows, row]
    g["p"] = g["q"] + rows * row  # scores, then probabilities [rows, P_ROW]
    g["m"] = g["p"] + rows * P_ROW  # the split's max and sum per row
    g["l"] = g["m"] + rows
    g["run_m"] = g["l"] + rows  # running max and sum per row
    g["run_l"] = g["run_m"] + rows
    g["new_m"] = g["run_l"] + rows  # their next values, staged until every thread read the old
    g["new_l"] = g["new_m"] + rows
    g["bad"] = g["new_l"] + rows  # per warp: first block-table entry outside the cache
    g["bytes"] = 4 * (g["bad"] + WARPS)
    return g


ROWS = geometry(MAX_DIM)["rows"]
SHARED_BYTES = geometry(MAX_DIM)["bytes"]


@cuda.jit(device=True)
def _probability(score, m):
    return math.exp(score - m) if score != NEG_INF else np.float32(0.0)


@functools.cache
def _prefill_kernel(masked: bool, dim: int):
    """The prefill kernel (module docstring) for heads of up to dim dims; masked: it takes the
    window and the cap (_attention_common), else ignores them."""
    g = geometry(dim)
    ROW, S_ROWS, ROWS, COL_GROUPS, V_ROWS = (
        g["row"],
        g["s_rows"],
        g["rows"],
        g["col_groups"],
        g["v_rows"],
    )
    K_AT, V_AT, Q_AT, P_AT, M_AT, L_AT = g["k"], g["v"], g["q"], g["p"], g["m"], g["l"]
    RUN_M_AT, RUN_L_AT, NEW_M_AT, NEW_L_AT = g["run_m"], g["run_l"], g["new_m"], g["new_l"]
    BAD_AT = g["bad"]
    _load_split = split_loader(WARPS, K_AT, V_AT, ROW, dim // MAX_DIM, masked)  # phase 1

    @cuda.jit(device=True)
    def _readable_keys(block_tables, s, b0, n_blocks, num_blocks, bs, tid, w, smem):
        """Keys of sequence s readable before the first of its table entries b0 .. n_blocks
        - 1 that is outside the cache (every key when none is): rows reaching past it are
        skipped, as the decode kernel skips a row with a bad entry in its splits.
        Block-uniform."""
        bad = NO_BAD
        for b in range(b0 + tid, n_blocks, THREADS):
            e = block_tables[s, b]
            if (e < 0 or e >= num_blocks) and b < bad:
                bad = np.float32(b)
        bad = -warp_max(-bad)
        if tid % 32 == 0:
            smem[BAD_AT + w] = bad
        cuda.syncthreads()
        first = smem[BAD_AT]
        for i in range(1, WARPS):
            first = -fmax(-first, -smem[BAD_AT + i])
        return bs * int(first)

    @cuda.jit(device=True)
    def _score_step(smem, q_at, k_at, d, sc):
        """sc[i, u] (row i, key u: four partial sums) advanced by dims d .. d + 3."""
        for u in range(S_KEYS):
            k0, k1, k2, k3 = shared_f32x4(smem, k_at + u * KEY_GROUPS * ROW + d)
            for i in range(S_ROWS):
                q0, q1, q2, q3 = shared_f32x4(smem, q_at + i * ROW + d)
                sc[i, u, 0] += q0 * k0
                sc[i, u, 1] += q1 * k1
                sc[i, u, 2] += q2 * k2
                sc[i, u, 3] += q3 * k3

    @cuda.jit(device=True)
    def _scores(smem, r0, kg, D, sc):
        """sc[i, u] <- the four partial sums of q_(r0 + i) . k_(kg + u KEY_GROUPS), in
        _score's order (dims in order, each residue class mod 4 its own sum)."""
        for i in range(S_ROWS):
            for u in range(S_KEYS):
                for c in range(4):
                    sc[i, u, c] = 0.0
        q_at, k_at = Q_AT + r0 * ROW, K_AT + kg * ROW
        if D % 32 == 0:  # the inner loop unrolls with constant offsets (_attention_split)
            for d0 in range(0, D, 32):
                for t in range(8):
                    _score_step(smem, q_at, k_at, d0 + 4 * t, sc)
        else:
            for d in range(0, D, 4):
                _score_step(smem, q_at, k_at, d, sc)

    @cuda.jit(device=True)
    def _softmax(smem, r0, kg, n_rows, lims, firsts, lo, cap, sc):
        """The split's softmax of rows r0 .. r0 + S_ROWS - 1, where the scores are (sc): p of
        this thread's keys to the probability rows, each row's max and sum of p to M and L
        (by the key groups' first thread). The eight key groups of a row are consecutive
        lanes, so octet_max4 and octet_sum4 give warp_max's and warp_sum's results over the
        row's keys with key j at lane j: the decode kernel's bits, without a pass through
        shared memory. Row i sees keys firsts[i] .. lims[i] - 1 (masked: its window) and its
        scores capped when cap > 0 (masked)."""
        for i in range(S_ROWS):
            r = r0 + i
            for u in range(S_KEYS):  # the score, in place of its first partial sum
                score = NEG_INF
                j = kg + u * KEY_GROUPS
                if r < n_rows and j < lims[i] - lo and (not masked or j >= firsts[i] - lo):
                    score = (sc[i, u, 0] + sc[i, u, 1]) + (sc[i, u, 2] + sc[i, u, 3])
                    if masked and cap > 0:
                        score = capped(score, cap)
                sc[i, u, 0] = score
            m = octet_max4(sc[i, 0, 0], sc[i, 1, 0], sc[i, 2, 0], sc[i, 3, 0])
            # p as scalars, not through the float32 array: the simulator's exp is float64 and
            # its warp_sum adds the unrounded values
            p0, p1 = _probability(sc[i, 0, 0], m), _probability(sc[i, 1, 0], m)
            p2, p3 = _probability(sc[i, 2, 0], m), _probability(sc[i, 3, 0], m)
            at = P_AT + r * P_ROW + kg
            smem[at] = p0
            smem[at + KEY_GROUPS] = p1
            smem[at + 2 * KEY_GROUPS] = p2
            smem[at + 3 * KEY_GROUPS] = p3
            l = octet_sum4(p0, p1, p2, p3)
            if kg == 0:
                smem[M_AT + r] = m
                smem[L_AT + r] = l

    @cuda.jit(device=True)
    def _columns(smem, r0, pieces, pv, ps):
        """pv[i, c] <- sum over the split's keys j of p[r0 + i, j] * V[j, piece c], keys in
        order (_weighted_columns' order); p read four keys at a time (ps: [V_ROWS, 4]
        registers). pieces: the column offsets of this thread's pieces (a piece past the
        head repeats one inside it; its sums are not used)."""
        for i in range(V_ROWS):
            for c in range(PIECES):
                for e in range(4):
                    pv[i, c, e] = 0.0
        for j4 in range(0, SPLIT, 4):
            for i in range(V_ROWS):
                p_at = P_AT + (r0 + i) * P_ROW + j4
                ps[i, 0], ps[i, 1], ps[i, 2], ps[i, 3] = shared_f32x4(smem, p_at)
            for u in range(4):
                for c in range(PIECES):
                    v0, v1, v2, v3 = shared_f32x4(smem, V_AT + (j4 + u) * ROW + pieces[c])
                    for i in range(V_ROWS):
                        p = ps[i, u]
                        pv[i, c, 0] += p * v0
                        pv[i, c, 1] += p * v1
                        pv[i, c, 2] += p * v2
                        pv[i, c, 3] += p * v3

    @cuda.jit(cache=True, **_REGISTERS)
    def kernel(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        out,
        first_token,
        window,
        cap,
    ):
        grid_dependency_sync()
        tile, hk = cuda.gridDim.x - 1 - cuda.blockIdx.x, cuda.blockIdx.y  # heaviest first
        tid = cuda.threadIdx.x
        w, lane = tid // 32, tid % 32
        num_blocks, bs, Hk, D = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2], q.shape[2]
        G = q.shape[1] // Hk
        quads = D // 4
        per_tile = ROWS // G
        t_end = imin(first_token + (tile + 1) * per_tile, q.shape[0])
        smem = cuda.shared.array(0, float32)  # dynamic: geometry(dim)["bytes"]
        acc = cuda.local.array((V_ROWS, PIECES, 4), float32)  # running p @ V of its rows
        pv = cuda.local.array((V_ROWS, PIECES, 4), float32)  # the split's
        ps = cuda.local.array((V_ROWS, 4), float32)
        sc = cuda.local.array((S_ROWS, S_KEYS, 4), float32)
        lims = cuda.local.array(S_ROWS, np.int64)  # per score row: keys it sees
        firsts = cuda.local.array(S_ROWS, np.int64)  # and its window's first (masked)
        pieces = cuda.local.array(PIECES, np.int64)
        shift = block_shift(bs)
        kg, s_r0 = tid % KEY_GROUPS, (tid // KEY_GROUPS) * S_ROWS  # score tile
        cg, v_r0 = tid % COL_GROUPS, (tid // COL_GROUPS) * V_ROWS  # p @ V tile
        for c in range(PIECES):
            pieces[c] = 4 * imin(cg + c * COL_GROUPS, quads - 1)
        first = first_token + tile * per_tile
        while first < t_end:  # one run of tokens of one sequence at a time
            s = _sequence_of(query_start_loc, first)
            if s < 0:
                first += 1  # padding row: left unwritten
                continue
            end, ctx = imin(t_end, query_start_loc[s + 1]), seq_lens[s]
            run_start, first = first, end
            n_q = query_start_loc[s + 1] - query_start_loc[s]
            if ctx < n_q or (ctx + bs - 1) // bs > block_tables.shape[1]:
                continue  # metadata that does not fit: the rows stay unwritten
            base = ctx - query_start_loc[s + 1] + 1  # keys seen by token t: base + t
            n_blocks = (base + end - 1 + bs - 1) // bs
            # the run's first key and split: its first row's window starts first
            key_lo = window_start(base + run_start, window) if masked else 0
            sp_lo = key_lo // SPLIT
            cuda.syncthreads()  # the last run's reads of shared memory are done
            readable = _readable_keys(
                block_tables, s, sp_lo * SPLIT // bs, n_blocks, num_blocks, bs, tid, w, smem
            )
            end = imin(end, readable - base + 1)  # tokens whose whole window is readable
            if end <= run_start:
                continue
            n_rows = (end - run_start) * G
            n_keys = base + end - 1  # the run's longest window
            for r in range(w, n_rows, WARPS):  # a row per warp: two divisions a row
                t, h = run_start + r // G, hk * G + r % G
                for d in range(lane, D, 32):
                    smem[Q_AT + r * ROW + d] = q[t, h, d] * scale
            if tid < n_rows:
                smem[RUN_M_AT + tid] = NEG_INF
                smem[RUN_L_AT + tid] = 0.0
            for i in range(V_ROWS):
                for c in range(PIECES):
                    for e in range(4):
                        acc[i, c, e] = 0.0
            for i in range(S_ROWS):
                lims[i] = base + run_start + (s_r0 + i) // G
                if masked:
                    firsts[i] = window_start(lims[i], window)
            for sp in range(sp_lo, (n_keys + SPLIT - 1) // SPLIT):
                lo = sp * SPLIT
                _load_split(
                    k_cache,
                    v_cache,
                    block_tables,
                    s,
                    hk,
                    lo,
                    imin(n_keys - lo, SPLIT),
                    key_lo,
                    w,
                    lane,
                    D,
                    smem,
                    shift,
                )
                cuda.syncthreads()
                _scores(smem, s_r0, kg, D, sc)
                _softmax(smem, s_r0, kg, n_rows, lims, firsts, lo, cap, sc)
                cuda.syncthreads()
                _columns(smem, v_r0, pieces, pv, ps)
                for i in range(V_ROWS):
                    r = v_r0 + i
                    if r < n_rows:  # _fold of the running and the split's state, per column
                        m, l = smem[RUN_M_AT + r], smem[RUN_L_AT + r]
                        top, total, c1, c2, how = _fold_weights(
                            m, l, smem[M_AT + r], smem[L_AT + r]
                        )
                        if how != KEEP_FIRST:  # one branch a row, not one a column
                            for c in range(PIECES):
                                for e in range(4):
                                    a, a2 = acc[i, c, e], pv[i, c, e]
                                    if how == MIX:
                                        acc[i, c, e] = _fold_acc(a, a2, c1, c2, MIX)
                                    else:
                                        acc[i, c, e] = _fold_acc(a, a2, c1, c2, TAKE_SECOND)
                        if cg == 0:
                            smem[NEW_M_AT + r] = top
                            smem[NEW_L_AT + r] = total
                cuda.syncthreads()  # K, V, P and the old running max / sum all read
                if tid < n_rows:
                    smem[RUN_M_AT + tid] = smem[NEW_M_AT + tid]
                    smem[RUN_L_AT + tid] = smem[NEW_L_AT + tid]
            cuda.syncthreads()
            for i in range(V_ROWS):
                r = v_r0 + i
                if r < n_rows:
                    t, h, l = run_start + r // G, hk * G + r % G, smem[RUN_L_AT + r]
                    for c in range(PIECES):
                        piece = cg + c * COL_GROUPS
                        if piece < quads:
                            for e in range(4):
                                out[t, h, 4 * piece + e] = acc[i, c, e] / l

    return kernel


_prefill_kernel_plain = _prefill_kernel(False, MAX_DIM)  # (tools/kernel_report.py names)


def prefill_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    out,
    *,
    first_token=0,
    window=0,
    softcap=0.0,
    stream=0,
) -> None:
    """As attention.paged_attention, whose launcher has checked the arguments (and that
    _attention_split supports the shape), for rows first_token on (the rows before it are left
    to another kernel)."""
    T, Hq, D = q.shape
    if T <= first_token:
        return
    Hk = k_cache.shape[2]
    dim = dim_for(D)
    g = geometry(dim)
    kernel = _prefill_kernel(bool(window or softcap), dim)
    per_tile = g["rows"] // (Hq // Hk)
    grid = (-(-(T - first_token) // per_tile), Hk)
    args = (
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        np.float32(scale),
        out,
        first_token,
        np.int32(window),
        np.float32(softcap),
    )
    allow_dynamic_shared(kernel, args, g["bytes"])
    kernel[grid, THREADS, stream, g["bytes"]](*args)
