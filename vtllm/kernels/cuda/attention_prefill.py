"""Causal attention of a prefill step over the paged KV cache: attention_split's bits, with one
load of each key split shared by several query tokens. Hot path: keep it lean.

attention_split's decode kernel gives a block one token and one kv head; a prefill of n tokens
through it loads every split of K and V n times, and at G = Hq / Hk = 2 half of each block's
threads idle in the score and p @ V phases. Here a block owns one kv head and a tile of
ROWS // G consecutive tokens, so up to ROWS (token, query head) rows: the tokens of the tile
that belong to one sequence (a run) go through each split together. Per split:
  1. load: the split's K and V into shared memory, once, through attention_split._load_split;
  2. scores: warp w takes rows w, w + WARPS, ..., lane j key j (q . k by _score), then the
     row's max and sum of exp by two warp reductions, exactly as the decode kernel does for a
     head. A row whose causal window ends before this split has no key in it: its state is
     empty (max -inf), and folding an empty state returns the running one unchanged;
  3. p @ V by _weighted_columns, each thread ITEMS fixed (row, four-column) pieces, folded
     into running states held in registers (max and sum per row in shared memory).
The split's state of a row is the decode kernel's for that row (same keys at the same lanes,
same operations: keys loaded for a longer row of the run only add p = 0 terms past the row's
last key, as the decode kernel's padding keys do), and the splits are folded in order with
attention_split._fold, as its combine kernel folds them: a token's output has the same bits
whichever path computed it.
"""

import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._device import NEG_INF, SIMULATOR, fmax, imin, warp_max, warp_sum
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
    _score,
    _weighted_columns,
)

ROWS = 8 if SIMULATOR else 16  # (token, query head) rows per block: 16 / G tokens
ITEMS = ROWS * (MAX_DIM // 4) // THREADS  # (row, four-column) pieces per thread in p @ V
assert ROWS >= MAX_GROUP and ITEMS * THREADS == ROWS * (MAX_DIM // 4)
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
    acc = cuda.local.array((ITEMS, 4), float32)  # registers: constant indices once unrolled
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
        for sp in range((n_keys + SPLIT - 1) // SPLIT):
            lo = sp * SPLIT
            _load_split(k_cache, v_cache, block_tables, s, hk, lo, imin(n_keys - lo, SPLIT),
                        w, lane, D, smem)  # fmt: skip
            cuda.syncthreads()
            for r0 in range(0, n_rows, WARPS):  # block-uniform: every warp reduces alike
                r = r0 + w
                score = NEG_INF
                if r < n_rows and lane < base + run_start + r // G - lo:
                    score = _score(smem, Q_AT + r * MAX_DIM, lane, D)
                m = warp_max(score)
                p = math.exp(score - m) if score != NEG_INF else np.float32(0.0)
                l = warp_sum(p)
                if r < n_rows:
                    smem[P_AT + r * SPLIT + lane] = p
                    if lane == 0:
                        smem[M_AT + r] = m
                        smem[L_AT + r] = l
            cuda.syncthreads()
            for i in range(ITEMS):
                e = tid + i * THREADS
                if e < n_rows * quads:
                    r, d = e // quads, 4 * (e % quads)
                    a0, a1, a2, a3 = _weighted_columns(smem, P_AT + r * SPLIT, d)
                    m2, l2 = smem[M_AT + r], smem[L_AT + r]
                    m, l = smem[RUN_M_AT + r], smem[RUN_L_AT + r]
                    nm, nl, acc[i, 0] = _fold(m, l, acc[i, 0], m2, l2, a0)
                    nm, nl, acc[i, 1] = _fold(m, l, acc[i, 1], m2, l2, a1)
                    nm, nl, acc[i, 2] = _fold(m, l, acc[i, 2], m2, l2, a2)
                    nm, nl, acc[i, 3] = _fold(m, l, acc[i, 3], m2, l2, a3)
                    if d == 0:
                        smem[NEW_M_AT + r] = nm
                        smem[NEW_L_AT + r] = nl
            cuda.syncthreads()  # K, V, P and the old running max / sum all read
            if tid < n_rows:
                smem[RUN_M_AT + tid] = smem[NEW_M_AT + tid]
                smem[RUN_L_AT + tid] = smem[NEW_L_AT + tid]
        cuda.syncthreads()
        for i in range(ITEMS):
            e = tid + i * THREADS
            if e < n_rows * quads:
                r, d = e // quads, 4 * (e % quads)
                t, h, l = run_start + r // G, hk * G + r % G, smem[RUN_L_AT + r]
                for c in range(4):
                    out[t, h, d + c] = acc[i, c] / l


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
