"""Causal attention of a prefill step over the paged KV cache: attention_split's bits, with one
load of each key split shared by several query tokens. Hot path: keep it lean.

attention_split's decode kernel gives a block one token and one kv head; a prefill of n tokens
through it loads every split of K and V n times, and at G = Hq / Hk = 2 half of each block's
threads idle in the score and p @ V phases. Here a block owns one kv head and a tile of
ROWS // G consecutive tokens, so up to ROWS (token, query head) rows: the tokens of the tile
that belong to one sequence (a run) go through each split together. Per split:
  1. load: the split's K and V into shared memory, once, through attention_split._load_split;
  2. scores: warp w takes ROWS_PER_WARP rows at once, lane j key j, each of the lane's key
     loads serving every row; then each row's max and sum of exp by two warp reductions, as
     the decode kernel does for a head. A row whose causal window ends before this split has
     no key in it: its state is empty (max -inf), and folding an empty state returns the
     running one unchanged;
  3. p @ V: each thread ITEMS rows of one four-column piece, each V load serving them all,
     folded into running states held in registers (max and sum per row in shared memory).
Per row and key, and per row and column, the sums run in the decode kernel's order (its
_score and _weighted_columns, written out here for several rows).
The split's state of a row is the decode kernel's for that row (same keys at the same lanes,
same operations: keys loaded for a longer row of the run only add p = 0 terms past the row's
last key, as the decode kernel's padding keys do), and the splits are folded in order with
attention_split._fold, as its combine kernel folds them: a token's output has the same bits
whichever path computed it.

On the H200 (tools/device_bench_attention.py --prefill, one prompt): 1.3-2.3x faster than one
token per block at 1,024-4,096 tokens, slower at 128 (85 against 63 us at the Qwen3-0.6B shape:
128 blocks leave SMs idle; fewer tokens per block there, and rows spread over the warps, measured
slower still), and still ~7x slower than torch's float32 SDPA, which uses tensor cores.
"""

import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._device import NEG_INF, SIMULATOR, fmax, imin, warp_max, warp_sum
from vtllm.kernels.cuda._ptx_f32x4 import shared_f32x4
from vtllm.kernels.cuda.attention import _sequence_of
from vtllm.kernels.cuda.attention_split import (
    K_AT,
    MAX_DIM,
    MAX_GROUP,
    ROW,
    SPLIT,
    THREADS,
    V_AT,
    WARPS,
    _fold,
    _load_split,
    block_shift,
)

ROWS = 8 if SIMULATOR else 16  # (token, query head) rows per block: 16 / G tokens
ROWS_PER_WARP = ROWS // WARPS  # in the score phase
# p @ V: thread i takes column piece i % quads of rows i // quads + k * (THREADS // quads),
# k < ITEMS; at head_dim 128 (32 pieces) that is 4 rows apart, fewer pieces spread further
ITEMS = ROWS * (MAX_DIM // 4) // THREADS
assert ROWS >= MAX_GROUP and ITEMS * THREADS == ROWS * (MAX_DIM // 4)
assert ROWS_PER_WARP * WARPS == ROWS
# K and V at attention_split's offsets (for _load_split); the rest around them, in one array
P_AT = 0  # probabilities [ROWS, SPLIT]
M_AT = P_AT + ROWS * SPLIT  # the split's max and sum per row
L_AT = M_AT + ROWS
RUN_M_AT = L_AT + ROWS  # running max and sum per row
RUN_L_AT = RUN_M_AT + ROWS
NEW_M_AT = RUN_L_AT + ROWS  # their next values, staged until every thread read the old
NEW_L_AT = NEW_M_AT + ROWS
BAD_AT = NEW_L_AT + ROWS  # per warp: first block-table entry outside the cache
Q_AT = V_AT + SPLIT * ROW  # scaled queries [ROWS, MAX_DIM]
SMEM_WORDS = Q_AT + ROWS * MAX_DIM
assert BAD_AT + WARPS <= K_AT and SMEM_WORDS * 4 <= 48 * 1024
NO_BAD = np.float32(1 << 24)
_REGISTERS = {} if SIMULATOR else {"max_registers": 128}


@cuda.jit(device=True)
def _readable_keys(block_tables, s, n_blocks, num_blocks, bs, tid, w, lane, smem):
    """Keys of sequence s readable before the first of its n_blocks table entries that is
    outside the cache (every key when none is): rows reaching past it are skipped, as the
    decode kernel skips a row with a bad entry in its window. Block-uniform."""
    bad = NO_BAD
    for b in range(tid, n_blocks, THREADS):
        e = block_tables[s, b]
        if (e < 0 or e >= num_blocks) and b < bad:
            bad = np.float32(b)
    bad = -warp_max(-bad)
    if lane == 0:
        smem[BAD_AT + w] = bad
    cuda.syncthreads()
    first = smem[BAD_AT]
    for i in range(1, WARPS):
        first = -fmax(-first, -smem[BAD_AT + i])
    return bs * int(first)


@cuda.jit(device=True)
def _scores(smem, r0, j, D, sc):
    """sc[i] <- the four partial sums of q_(r0 + i) . k_j, in _score's order."""
    for i in range(ROWS_PER_WARP):
        for c in range(4):
            sc[i, c] = 0.0
    k_at, q_at = K_AT + j * ROW, Q_AT + r0 * MAX_DIM
    if D % 32 == 0:  # the inner loop unrolls (see attention_split._score)
        for d0 in range(0, D, 32):
            for u in range(8):
                _score_step(smem, k_at, q_at, d0 + 4 * u, sc)
    else:
        for d in range(0, D, 4):
            _score_step(smem, k_at, q_at, d, sc)


@cuda.jit(device=True)
def _score_step(smem, k_at, q_at, d, sc):
    """sc[i] advanced by dims d .. d + 3 of key k_at against each row i's query."""
    k0, k1, k2, k3 = shared_f32x4(smem, k_at + d)
    for i in range(ROWS_PER_WARP):
        q0, q1, q2, q3 = shared_f32x4(smem, q_at + i * MAX_DIM + d)
        sc[i, 0] += q0 * k0
        sc[i, 1] += q1 * k1
        sc[i, 2] += q2 * k2
        sc[i, 3] += q3 * k3


@cuda.jit(device=True)
def _columns(smem, rr, step, d, pv, ps):
    """pv[k] <- sum over the split's keys j of p[row k, j] * V[j, d .. d + 3], row k being
    rr + k * step (clamped to the shared array), in _weighted_columns' order; each row's p
    read four keys at a time (ps: [ITEMS, 4] registers)."""
    for k in range(ITEMS):
        for c in range(4):
            pv[k, c] = 0.0
    for j4 in range(0, SPLIT, 4):
        for k in range(ITEMS):
            p_at = P_AT + imin(rr + k * step, ROWS - 1) * SPLIT + j4
            ps[k, 0], ps[k, 1], ps[k, 2], ps[k, 3] = shared_f32x4(smem, p_at)
        for u in range(4):
            v0, v1, v2, v3 = shared_f32x4(smem, V_AT + (j4 + u) * ROW + d)
            for k in range(ITEMS):
                p = ps[k, u]
                pv[k, 0] += p * v0
                pv[k, 1] += p * v1
                pv[k, 2] += p * v2
                pv[k, 3] += p * v3


@cuda.jit(cache=True, **_REGISTERS)
def _prefill_kernel(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out):
    tile, hk = cuda.blockIdx.x, cuda.blockIdx.y
    tid = cuda.threadIdx.x
    w, lane = tid // 32, tid % 32
    num_blocks, bs, Hk, D = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2], q.shape[2]
    G = q.shape[1] // Hk
    quads = D // 4
    per_tile = ROWS // G
    t_end = imin((tile + 1) * per_tile, q.shape[0])
    smem = cuda.shared.array(SMEM_WORDS, float32)  # the only one: 16-byte aligned
    # registers (constant indices once the loops are unrolled): running acc, split sums
    acc = cuda.local.array((ITEMS, 4), float32)
    pv = cuda.local.array((ITEMS, 4), float32)
    sc = cuda.local.array((ROWS_PER_WARP, 4), float32)
    ps = cuda.local.array((ITEMS, 4), float32)
    lims = cuda.local.array(ROWS_PER_WARP, np.int64)  # per score row: keys it sees, + lo
    shift = block_shift(bs)
    step = THREADS // quads  # p @ V rows apart for one thread
    rr, dq = tid // quads, 4 * (tid % quads)  # this thread's first row and column piece
    first = tile * per_tile
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
        cuda.syncthreads()  # the last run's reads of shared memory are done
        readable = _readable_keys(block_tables, s, n_blocks, num_blocks, bs, tid, w, lane, smem)
        end = imin(end, readable - base + 1)  # tokens whose whole window is readable
        if end <= run_start:
            continue
        n_rows = (end - run_start) * G
        n_keys = base + end - 1  # the run's longest window
        for e in range(tid, n_rows * D, THREADS):
            r, d = e // D, e % D
            t, g = run_start + r // G, r % G
            smem[Q_AT + r * MAX_DIM + d] = q[t, hk * G + g, d] * scale
        if tid < n_rows:
            smem[RUN_M_AT + tid] = NEG_INF
            smem[RUN_L_AT + tid] = 0.0
        for i in range(ITEMS):
            for c in range(4):
                acc[i, c] = 0.0
        r0 = w * ROWS_PER_WARP
        for i in range(ROWS_PER_WARP):
            lims[i] = base + run_start + (r0 + i) // G
        for sp in range((n_keys + SPLIT - 1) // SPLIT):
            lo = sp * SPLIT
            _load_split(k_cache, v_cache, block_tables, s, hk, lo, imin(n_keys - lo, SPLIT),
                        w, lane, D, smem, shift)  # fmt: skip
            cuda.syncthreads()
            _scores(smem, r0, lane, D, sc)
            for i in range(ROWS_PER_WARP):  # block-uniform: every warp reduces alike
                r = r0 + i
                score = NEG_INF
                if r < n_rows and lane < lims[i] - lo:
                    score = (sc[i, 0] + sc[i, 1]) + (sc[i, 2] + sc[i, 3])
                m = warp_max(score)
                p = math.exp(score - m) if score != NEG_INF else np.float32(0.0)
                l = warp_sum(p)
                if r < n_rows:
                    smem[P_AT + r * SPLIT + lane] = p
                    if lane == 0:
                        smem[M_AT + r] = m
                        smem[L_AT + r] = l
            cuda.syncthreads()
            if rr < step:
                _columns(smem, rr, step, dq, pv, ps)
            for k in range(ITEMS):
                r = rr + k * step
                if rr < step and r < n_rows:
                    m2, l2 = smem[M_AT + r], smem[L_AT + r]
                    m, l = smem[RUN_M_AT + r], smem[RUN_L_AT + r]
                    nm, nl, acc[k, 0] = _fold(m, l, acc[k, 0], m2, l2, pv[k, 0])
                    nm, nl, acc[k, 1] = _fold(m, l, acc[k, 1], m2, l2, pv[k, 1])
                    nm, nl, acc[k, 2] = _fold(m, l, acc[k, 2], m2, l2, pv[k, 2])
                    nm, nl, acc[k, 3] = _fold(m, l, acc[k, 3], m2, l2, pv[k, 3])
                    if dq == 0:
                        smem[NEW_M_AT + r] = nm
                        smem[NEW_L_AT + r] = nl
            cuda.syncthreads()  # K, V, P and the old running max / sum all read
            if tid < n_rows:
                smem[RUN_M_AT + tid] = smem[NEW_M_AT + tid]
                smem[RUN_L_AT + tid] = smem[NEW_L_AT + tid]
        cuda.syncthreads()
        for k in range(ITEMS):
            r = rr + k * step
            if rr < step and r < n_rows:
                t, h, l = run_start + r // G, hk * G + r % G, smem[RUN_L_AT + r]
                for c in range(4):
                    out[t, h, dq + c] = acc[k, c] / l


def prefill_attention(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out,
                      *, stream=0) -> None:  # fmt: skip
    """As attention.paged_attention, whose launcher has checked the arguments (and that
    attention_split supports the shape)."""
    T, Hq, _ = q.shape
    Hk = k_cache.shape[2]
    per_tile = ROWS // (Hq // Hk)
    grid = (-(-T // per_tile), Hk)
    _prefill_kernel[grid, THREADS, stream](q, k_cache, v_cache, block_tables, seq_lens,
                                           query_start_loc, np.float32(scale), out)  # fmt: skip
