"""Paged attention split over keys (flash-decoding), bitwise the same however it is launched.
Hot path: keep it lean.

A block serves one query token and one kv head, so the GQA group's query heads (G <= MAX_GROUP)
share every K and V load. Keys are cut into splits of SPLIT = 32 positions, and a block works a
split in three phases, each across the whole block, all through one shared array:
  1. load: every K and V row of the split into shared memory (warp w takes keys w, w + WARPS,
     ..., lane l dims 4l .. 4l + 3 with 128-bit loads), all of a thread's loads issued before
     its first store, so a split costs one trip to memory, not one per key;
  2. scores: warp w takes query head w (w + WARPS, ...), lane j key j: q . k from shared memory,
     then the split's max and sum of exp by two warp reductions;
  3. p @ V: each thread sums four columns of V for one head, weighted by the probabilities.
A split's state (max m, sum l, acc) is thus a function of its keys only, and the row's result
is the in-order fold of its splits' states, always through `_fold`:
  - decode (`scratch` given, T <= its rows): splits spread over blocks (about TARGET_BLOCKS
    in all), partial states to scratch, then `_combine_kernel` folds them in split order: the
    GPU is filled even at batch 1;
  - otherwise (prefill): attention_prefill's kernel, whose blocks each take several tokens of
    a sequence through the same phases on the same helpers (one load of a split serves them
    all) and fold each row's splits in order as they go.
Both paths run the same code on the same keys in the same order, so a token's output does not
depend on the path, the batch or the chunking (the depth-2 law needs that on the GPU too).

A block checks the block-table entries of its own splits as it loads them (a bad one marks
the split, and the combine then leaves the row unwritten), and reads a decode row's metadata
in one trip (_row): two round trips to memory fewer before the keys arrive.

rope_attention runs qkv_rope's work inside the split kernel for steps of one token per
sequence: each warp norms and rotates one head in registers (_rope_head), and the block that
reads a row's newest key makes that key and writes it to the cache. Kept small on purpose:
in a kernel that runs most of its instructions once, time follows code size more than work
(likely instruction fetch), so the rope work stays in registers, a head a warp, rather than
going through shared memory in unrolled items, which doubles the code.
"""

import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._device import (
    NEG_INF,
    SIMULATOR,
    fma32,
    fmax,
    imin,
    lane_xor16,
    warp_max,
    warp_sum,
)
from vtllm.kernels.cuda._host import placeholder
from vtllm.kernels.cuda._kv_cache import kv_rounded, kv_store, kv_value4_at
from vtllm.kernels.cuda._ptx import grid_dependency_sync, item_at, prefetch_l1
from vtllm.kernels.cuda._ptx_f32x4 import shared_f32x4, store_f32x4, store_shared_f32x4
from vtllm.kernels.cuda.attention import _sequence_of, check_attention
from vtllm.kernels.cuda.qkv_rope import check_qkv_rope, head_inv_rms, rotated

SPLIT = 32  # keys per split: one per lane in the score phase
WARPS = 4
THREADS = 32 * WARPS
MAX_GROUP = 8  # query heads per kv head
MAX_DIM = 128  # head_dim: lane l loads dims 4l .. 4l + 3
Q_PER_THREAD = MAX_GROUP * MAX_DIM // THREADS  # query values a thread loads (at most)
# Shared row stride in floats: a multiple of 4 (128-bit accesses), and 4 mod 32 so that the
# eight lanes of a quarter-warp reading one 128-bit piece of eight rows hit all 32 banks.
ROW = MAX_DIM + 4
# One shared array carved into regions (a single array starts at the block's shared base, so
# every region below is 16-byte aligned: all offsets are multiples of 4 floats). attention_prefill
# lays out its own regions and loads K and V with split_loader too.
Q_AT = 0  # scaled queries [MAX_GROUP, MAX_DIM]
K_AT = Q_AT + MAX_GROUP * MAX_DIM  # the split's keys [SPLIT, ROW]
V_AT = K_AT + SPLIT * ROW  # and values
P_AT = V_AT + SPLIT * ROW  # probabilities [MAX_GROUP, SPLIT]
M_AT = P_AT + MAX_GROUP * SPLIT  # the split's max and sum per head
L_AT = M_AT + MAX_GROUP
NEW_K_AT = L_AT + MAX_GROUP  # rope_attention: the row's new key and value as the cache holds
NEW_V_AT = NEW_K_AT + MAX_DIM  # them
SMEM_WORDS = NEW_V_AT + MAX_DIM
# decode grid size to aim for: a few blocks an SM, chosen by a sweep of grid sizes (larger
# grids only add blocks that loop over fewer splits; BENCHMARKS.md, Kernels)
TARGET_BLOCKS = 512
# a cap of 128 registers lets four blocks share an SM at the cost of a few spills
# (tools/kernel_report.py); the extra warps hide more of the load latency than the spills
# cost, unlike the compiler's own choice (bench/gpu_attention.py)
_REGISTERS = {} if SIMULATOR else {"max_registers": 128}


def splits_for(max_positions: int) -> int:
    return -(-max_positions // SPLIT)


KEEP_FIRST, TAKE_SECOND, MIX = 0, 1, 2  # how _fold_weights says to merge two accs


@cuda.jit(device=True)
def _fold_weights(m, l, m2, l2):
    """The merged max and sum of states (m, l) and (m2, l2), and how their accs merge:
    (top, sum, c1, c2, how); a state with m = -inf is empty. Computed once for a row whose
    accs are many columns."""
    if m2 == NEG_INF:
        return m, l, np.float32(1.0), np.float32(0.0), KEEP_FIRST
    if m == NEG_INF:
        return m2, l2, np.float32(0.0), np.float32(1.0), TAKE_SECOND
    top = fmax(m, m2)
    c1 = math.exp(m - top)
    c2 = math.exp(m2 - top)
    return top, fma32(l, c1, l2 * c2), c1, c2, MIX


@cuda.jit(device=True)
def _fold_acc(a, a2, c1, c2, how):
    """One column of two accs merged with _fold_weights' (c1, c2, how)."""
    if how == KEEP_FIRST:
        return a
    if how == TAKE_SECOND:
        return a2
    return fma32(a, c1, a2 * c2)  # one rounding order in every kernel that folds


@cuda.jit(device=True)
def _fold(m, l, a, m2, l2, a2):
    """(m, l, a) merged with (m2, l2, a2); a state with m = -inf is empty."""
    top, total, c1, c2, how = _fold_weights(m, l, m2, l2)
    return top, total, _fold_acc(a, a2, c1, c2, how)


@cuda.jit(device=True)
def _row(query_start_loc, seq_lens, block_tables, t, bs):
    """(sequence, keys this query sees) for token row t, or (-1, 0) when the row is padding or
    its metadata does not fit the block table. In a decode step row t is sequence t: its
    bounds and length are read in one trip to memory, and only other steps search."""
    s, ctx = -1, 0
    if t < seq_lens.shape[0]:
        start, end, ctx = query_start_loc[t], query_start_loc[t + 1], seq_lens[t]
        if start == t and end == t + 1:
            s = t
    if s < 0:
        s = _sequence_of(query_start_loc, t)
        if s < 0:
            return -1, 0
        ctx = seq_lens[s]
    n_q = query_start_loc[s + 1] - query_start_loc[s]
    if ctx < n_q or (ctx + bs - 1) // bs > block_tables.shape[1]:
        return -1, 0
    return s, ctx - (query_start_loc[s + 1] - t) + 1


@cuda.jit(device=True)
def block_shift(bs):
    """log2(bs) for a power-of-two block size, else -1 (computed once per block): a key's
    block and offset are then a shift and a mask, not a 64-bit division, which numba calls as
    a subroutine of ~100 instructions, twice per key and split."""
    sh = 0
    while (1 << sh) < bs:
        sh += 1
    return sh if (1 << sh) == bs else -1


@cuda.jit(device=True)
def _slot_of_slot(slot, bs, shift):
    """(slot // bs, slot % bs): a cache slot's block and offset, or a key position's
    block-table entry and offset."""
    if shift >= 0:
        return slot >> shift, slot & (bs - 1)
    return slot // bs, slot % bs


def split_loader(warps: int, k_at: int, v_at: int):
    """Phase 1 for a block of `warps` warps whose shared K and V rows start at k_at and v_at:
    load(k_cache, v_cache, block_tables, s, hk, lo, n_here, w, lane, D, smem, shift) puts keys
    lo .. lo + n_here - 1 into rows 0 .. n_here - 1 of K and V (warp w keys w, w + warps, ..,
    lane l dims 4l .. 4l + 3). Rows past n_here repeat key lo (finite values that p = 0 will
    weigh), so no branch depends on the key. Fixed trip counts: unrolled, the loaded rows live
    in registers and every load is in flight before the first store. shift: block_shift(block
    size). Returns 1 where a key's block-table entry is outside the cache (its rows then hold
    block 0's values), else 0: the split's own check, made in the same trip as the loads."""
    keys_per_warp = SPLIT // warps
    assert keys_per_warp * warps == SPLIT

    @cuda.jit(device=True)
    def load(k_cache, v_cache, block_tables, s, hk, lo, n_here, w, lane, D, smem, shift):
        d = 4 * lane
        if d >= D:
            return 0
        num_blocks, bs, Hk = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
        # a slot's K (and V) row is one run of Hk D values: this lane's 4 start at head_at
        slot_values, head_at = np.int32(Hk * D), np.int32(hk * D + d)
        kr = cuda.local.array((keys_per_warp, 4), float32)
        vr = cuda.local.array((keys_per_warp, 4), float32)
        bad = 0
        table_at = s * block_tables.shape[1]  # the sequence's row of the block table
        for i in range(keys_per_warp):
            jj = w + warps * i
            j = np.int32(lo + (jj if jj < n_here else 0))
            e, off = _slot_of_slot(j, bs, shift)
            blk = item_at(block_tables, table_at + e)
            if blk < 0 or blk >= num_blocks:
                blk, bad = 0, 1
            at = np.int32(blk * bs + off) * slot_values + head_at  # 64-bit: caches > 8 GB
            kr[i, 0], kr[i, 1], kr[i, 2], kr[i, 3] = kv_value4_at(k_cache, at)
            vr[i, 0], vr[i, 1], vr[i, 2], vr[i, 3] = kv_value4_at(v_cache, at)
        for i in range(keys_per_warp):
            at = (w + warps * i) * ROW + d
            store_shared_f32x4(smem, k_at + at, kr[i, 0], kr[i, 1], kr[i, 2], kr[i, 3])
            store_shared_f32x4(smem, v_at + at, vr[i, 0], vr[i, 1], vr[i, 2], vr[i, 3])
        return bad

    return load


_load_split = split_loader(WARPS, K_AT, V_AT)


@cuda.jit(device=True)
def _dot_step(smem, q_at, k_at, d, a0, a1, a2, a3):
    """The four partial sums of q . k advanced by dims d .. d + 3."""
    q0, q1, q2, q3 = shared_f32x4(smem, q_at + d)
    k0, k1, k2, k3 = shared_f32x4(smem, k_at + d)
    return a0 + q0 * k0, a1 + q1 * k1, a2 + q2 * k2, a3 + q3 * k3


@cuda.jit(device=True)
def _score(smem, q_at, j, D):
    """q . k_j from shared memory (the query row at q_at), four partial sums."""
    k_at = K_AT + j * ROW
    a0 = a1 = a2 = a3 = np.float32(0.0)
    # dims in order; 32 per trip when D is a multiple of 32, so that the inner loop's 8 steps
    # unroll with constant offsets from running ones (a loop of D / 4 steps does not, and
    # pays address math every step), and unit-step counters (a stepped range keeps a 64-bit
    # one with a sign test per trip)
    if D % 32 == 0:
        for _ in range(D // 32):
            for u in range(8):
                a0, a1, a2, a3 = _dot_step(smem, q_at, k_at, 4 * u, a0, a1, a2, a3)
            q_at += 32
            k_at += 32
    else:
        for i in range(D // 4):
            a0, a1, a2, a3 = _dot_step(smem, q_at, k_at, 4 * i, a0, a1, a2, a3)
    return (a0 + a1) + (a2 + a3)


@cuda.jit(device=True)
def _weighted_columns(smem, p_at, d):
    """sum over the split's keys j of p[j] * V[j, d .. d + 3] (the row's p at p_at, a
    multiple of 4), keys in order; p read four at a time."""
    a0 = a1 = a2 = a3 = np.float32(0.0)
    v_at = V_AT + d
    for _ in range(SPLIT // 4):  # running offsets: constant ones from them in a trip
        ps = shared_f32x4(smem, p_at)
        for u in range(4):
            p = ps[u]
            v0, v1, v2, v3 = shared_f32x4(smem, v_at + u * ROW)
            a0 += p * v0
            a1 += p * v1
            a2 += p * v2
            a3 += p * v3
        p_at += 4
        v_at += 4 * ROW
    return a0, a1, a2, a3


@cuda.jit(device=True)
def _stage_queries(smem, qv, G, D, scale, tid):
    """qv (item i: e = tid + i THREADS of the block's G D query values, head e // D, dim
    e % D: stepped, not divided) scaled into the Q region."""
    g, d = tid // D, tid % D
    for i in range(Q_PER_THREAD):
        if g < G:
            smem[Q_AT + g * MAX_DIM + d] = qv[i] * scale
        g, d = g + THREADS // D, d + THREADS % D
        if d >= D:
            g, d = g + 1, d - D


@cuda.jit(device=True)
def _rope_head(x0, x1, x2, x3, w0, w1, w2, w3, c0, s0, c1, s1, lane, D, eps, has_norm, turn):
    """One head of D = 32 n values (n = 1, 2 or 4) held by a warp, lane l dims l, 32 + l, ..
    (x0 .. x3), normed (weights w0 .. w3 at the same dims) and rotated as qkv_rope does it:
    its sums (32 dims by warp_sum, then in order) and its expressions, so its bits. c0, s0
    (c1, s1): cos and sin of the pair of x0 (x1) for D > 32; for D = 32, of lane % 16's.
    Every lane of the warp calls it (warp_sum)."""
    n = D // 32
    if has_norm:
        ss = warp_sum(x0 * x0)
        if n > 1:
            ss += warp_sum(x1 * x1)
        if n > 2:
            ss += warp_sum(x2 * x2)
            ss += warp_sum(x3 * x3)
        inv = head_inv_rms(ss, D, eps)
        x0, x1, x2, x3 = w0 * (x0 * inv), w1 * (x1 * inv), w2 * (x2 * inv), w3 * (x3 * inv)
    if not turn:
        return x0, x1, x2, x3
    if n == 1:  # dim l pairs with l + 16: the lane 16 away
        return rotated(x0, lane_xor16(x0), c0, s0, lane < 16), x1, x2, x3
    if n == 2:  # dim l pairs with 32 + l: the same lane
        return rotated(x0, x1, c0, s0, True), rotated(x1, x0, c0, s0, False), x2, x3
    return (
        rotated(x0, x2, c0, s0, True),
        rotated(x1, x3, c1, s1, True),
        rotated(x2, x0, c0, s0, False),
        rotated(x3, x1, c1, s1, False),
    )


@cuda.jit(device=True)
def _head_values(a, t, at, lane, n):
    """a[t, at + lane + 32 c] for c < n (n = 1, 2 or 4), else 0."""
    z = np.float32(0.0)
    x0 = a[t, at + lane]
    x1 = a[t, at + 32 + lane] if n > 1 else z
    x2 = a[t, at + 64 + lane] if n > 2 else z
    x3 = a[t, at + 96 + lane] if n > 2 else z
    return x0, x1, x2, x3


@cuda.jit(device=True)
def _weight_values(a, lane, n):
    """a[lane + 32 c] for c < n (n = 1, 2 or 4), else 0."""
    z = np.float32(0.0)
    x1 = a[32 + lane] if n > 1 else z
    x2 = a[64 + lane] if n > 2 else z
    x3 = a[96 + lane] if n > 2 else z
    return a[lane], x1, x2, x3


def _split_kernel_for(rope: bool):
    """The split kernel (module docstring); with rope it reads q from qkv and does qkv_rope's
    work for its row first (rope_attention)."""

    @cuda.jit(cache=True, **_REGISTERS)
    def kernel(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        part_acc,
        part_ml,
        slot_mapping,
        positions,
        cos_sin,
        q_norm,
        k_norm,
        eps,
        has_norm,
    ):
        grid_dependency_sync()
        t, hk, z, nz = cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z, cuda.gridDim.z
        tid = cuda.threadIdx.x
        w, lane = tid // 32, tid % 32
        num_blocks, bs, Hk, D = k_cache.shape
        Hq = part_acc.shape[1]
        G = Hq // Hk
        quads = D // 4  # four-column pieces of a head
        # The queries go in the same trip to memory as the row's metadata (they do not depend
        # on it); q is [T, Hq * D] (or qkv, whose first Hq * D columns are q), so this kv
        # head's G query heads are one run of G * D values.
        if rope:  # a head per warp (_rope_head): the first round's (query head w, or the new
            # key for w = G, its v and norm weights too) and the row's position and slot
            n = D // 32
            is_key = w == G
            at = (Hq + hk if is_key else hk * G + w) * D
            zero = np.float32(0.0)
            x = v = nw = (zero, zero, zero, zero)
            if w <= G:
                x = _head_values(q, t, at, lane, n)
                if has_norm:
                    nw = _weight_values(k_norm if is_key else q_norm, lane, n)
            if is_key:
                v = _head_values(q, t, at + Hk * D, lane, n)
            pos, slot = positions[t], slot_mapping[t]
            turn = 0 <= pos < cos_sin.shape[0]  # padding or a bad position: not rotated
            c0 = s0 = c1 = s1 = np.float32(0.0)
            if turn:  # the cos and sin of this lane's pairs (_rope_head)
                i = lane % 16 if n == 1 else lane
                c0, s0 = cos_sin[pos, i], cos_sin[pos, D // 2 + i]
                if n > 2:
                    c1, s1 = cos_sin[pos, 32 + lane], cos_sin[pos, D // 2 + 32 + lane]
        else:
            qv = cuda.local.array(Q_PER_THREAD, float32)
            for i in range(Q_PER_THREAD):
                e = tid + i * THREADS
                if e < G * D:
                    qv[i] = q[t, hk * G * D + e]
        s, n_keys = _row(query_start_loc, seq_lens, block_tables, t, bs)
        n_splits = (n_keys + SPLIT - 1) // SPLIT
        if s < 0 or z >= n_splits:
            return
        smem = cuda.shared.array(SMEM_WORDS, float32)
        shift = block_shift(bs)
        if rope:
            if query_start_loc[s + 1] - query_start_loc[s] != 1:  # not a one-token row
                if z == 0 and tid < G:  # a negative sum: the combine leaves the row unwritten
                    part_ml[t, hk * G + tid, 0, 1] = -1.0
                return
            # the first split's block-table entry is read after the work below: into L1 now
            prefetch_l1(block_tables, s, (z * SPLIT) >> shift if shift >= 0 else z * SPLIT // bs)
            writer = (n_splits - 1) % nz == z  # the block whose splits hold the new key
            for g0 in range(0, G + 1, WARPS):  # block-uniform: every warp reduces alike
                g = g0 + w
                if g0 > 0:  # later rounds (G >= WARPS) load their heads now
                    x = (zero, zero, zero, zero)
                    if g <= G:
                        at = (Hq + hk if g == G else hk * G + g) * D
                        x = _head_values(q, t, at, lane, n)
                        if g == G:
                            v = _head_values(q, t, at + Hk * D, lane, n)
                        if has_norm:
                            nw = _weight_values(k_norm if g == G else q_norm, lane, n)
                x = _rope_head(
                    x[0],
                    x[1],
                    x[2],
                    x[3],
                    nw[0],
                    nw[1],
                    nw[2],
                    nw[3],
                    c0,
                    s0,
                    c1,
                    s1,
                    lane,
                    D,
                    eps,
                    has_norm,
                    turn,
                )
                if g < G:
                    for c in range(4):
                        if c < n:
                            smem[Q_AT + g * MAX_DIM + 32 * c + lane] = x[c] * scale
                elif g == G and writer:
                    blk, off = _slot_of_slot(slot, bs, shift)
                    stored = 0 <= slot < num_blocks * bs  # padding or outside: not written
                    for c in range(4):
                        if c < n:
                            d = 32 * c + lane
                            if stored:
                                kv_store(k_cache, blk, off, hk, d, x[c])
                                kv_store(v_cache, blk, off, hk, d, v[c])
                            smem[NEW_K_AT + d] = kv_rounded(k_cache, x[c])
                            smem[NEW_V_AT + d] = kv_rounded(v_cache, v[c])
        else:
            _stage_queries(smem, qv, G, D, scale, tid)
        # p @ V items e = tid, tid + THREADS, .. as (head, piece) = divmod(e, quads), stepped
        # without dividing inside the split loop
        g_first, r_first = tid // quads, tid % quads
        g_step, r_step = THREADS // quads, THREADS % quads
        for sp in range(z, n_splits, nz):
            lo = sp * SPLIT
            n_here = imin(n_keys - lo, SPLIT)
            bad = _load_split(
                k_cache, v_cache, block_tables, s, hk, lo, n_here, w, lane, D, smem, shift
            )
            if cuda.syncthreads_or(bad):  # a negative sum: the combine leaves the row unwritten
                if tid < G:
                    part_ml[t, hk * G + tid, sp, 1] = -1.0
                continue
            if rope and sp == n_splits - 1:  # the new key as the cache now holds it: the
                if tid < D:  # loads above may have read that slot before the store
                    at = (n_keys - 1 - lo) * ROW + tid
                    smem[K_AT + at] = smem[NEW_K_AT + tid]
                    smem[V_AT + at] = smem[NEW_V_AT + tid]
                cuda.syncthreads()
            for g0 in range(0, G, WARPS):  # block-uniform trip count: every warp reduces alike
                g = g0 + w
                score = NEG_INF
                if g < G and lane < n_here:
                    score = _score(smem, Q_AT + g * MAX_DIM, lane, D)
                m = warp_max(score)
                p = math.exp(score - m) if score != NEG_INF else np.float32(0.0)
                l = warp_sum(p)
                if g < G:
                    smem[P_AT + g * SPLIT + lane] = p
                    if lane == 0:
                        smem[M_AT + g] = m
                        smem[L_AT + g] = l
            cuda.syncthreads()
            g, r = g_first, r_first
            while g < G:
                d = 4 * r
                a0, a1, a2, a3 = _weighted_columns(smem, P_AT + g * SPLIT, d)
                h = hk * G + g
                store_f32x4(part_acc, (t, h, sp, d), a0, a1, a2, a3)
                if d == 0:
                    part_ml[t, h, sp, 0] = smem[M_AT + g]
                    part_ml[t, h, sp, 1] = smem[L_AT + g]
                g, r = g + g_step, r + r_step
                if r >= quads:
                    g, r = g + 1, r - quads
            cuda.syncthreads()  # K, V, P, M and L all read before the next split's loads

    return kernel


_split_kernel = _split_kernel_for(False)
_split_rope_kernel = _split_kernel_for(True)


@cuda.jit(cache=True)
def _combine_kernel(part_acc, part_ml, block_tables, seq_lens, query_start_loc, bs, out):
    """Folds a row's split states in split order; eight splits' values are loaded before
    they are folded, so the loads overlap instead of queueing behind each fold."""
    grid_dependency_sync()
    t, h, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    s, n_keys = _row(query_start_loc, seq_lens, block_tables, t, bs)
    if s < 0 or tid >= out.shape[2]:
        return
    n = (n_keys + SPLIT - 1) // SPLIT
    m, l, a = NEG_INF, np.float32(0.0), np.float32(0.0)
    pm = cuda.local.array(8, float32)
    pl = cuda.local.array(8, float32)
    pa = cuda.local.array(8, float32)
    for sp0 in range(0, n, 8):
        for u in range(8):
            sp = imin(sp0 + u, n - 1)
            pm[u], pl[u], pa[u] = (
                part_ml[t, h, sp, 0],
                part_ml[t, h, sp, 1],
                part_acc[t, h, sp, tid],
            )
        for u in range(8):
            if sp0 + u < n:
                if pl[u] < 0:
                    return  # the split kernel found a block-table entry outside the cache
                m, l, a = _fold(m, l, a, pm[u], pl[u], pa[u])
    out[t, h, tid] = a / l


def supports(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    return head_dim <= MAX_DIM and head_dim % 4 == 0 and num_heads // num_kv_heads <= MAX_GROUP


def make_scratch(rows: int, num_heads: int, head_dim: int, max_positions: int, *, stream=0):
    """Partial states for the one-block-per-split path: rows x heads x splits."""
    n = splits_for(max_positions)
    return (
        cuda.device_array((rows, num_heads, n, head_dim), np.float32, stream=stream),
        cuda.device_array((rows, num_heads, n, 2), np.float32, stream=stream),
    )


def _fits_scratch(scratch, T: int, Hq: int, D: int) -> bool:
    return (
        scratch is not None
        and T <= scratch[0].shape[0]
        and scratch[0].shape[1:] == (Hq, scratch[0].shape[2], D)
    )


def _launch(
    kernel,
    q,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    out,
    scratch,
    rope_args,
    stream,
) -> None:
    """The split kernel over one block per (row, kv head, z), then the combine."""
    T, Hq, D = out.shape
    Hk, bs = k_cache.shape[2], k_cache.shape[1]
    part_acc, part_ml = scratch[0][:T], scratch[1][:T]
    # enough blocks to fill the GPU, each looping over splits z, z + nz, ...: with one block
    # per split of the longest context, a batch of short rows launches mostly empty blocks
    nz = min(part_acc.shape[2], max(1, -(-TARGET_BLOCKS // (T * Hk))))
    kernel[(T, Hk, nz), THREADS, stream](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        np.float32(scale),
        part_acc,
        part_ml,
        *rope_args,
    )
    _combine_kernel[(T, Hq), max(32, -(-D // 32) * 32), stream](
        part_acc, part_ml, block_tables, seq_lens, query_start_loc, bs, out
    )


def split_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    out,
    scratch,
    *,
    flash=False,
    stream=0,
) -> None:
    """As attention.paged_attention (its launcher has checked the arguments); scratch is
    make_scratch's pair or None (then, and for steps of more rows than it holds, the prefill
    kernel runs, or attention_flash's with flash)."""
    T, Hq, D = q.shape
    if not _fits_scratch(scratch, T, Hq, D):
        prompt_attention(
            flash,
            q,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            query_start_loc,
            scale,
            out,
            stream=stream,
        )
        return
    _launch(
        _split_kernel,
        q.reshape(T, Hq * D),
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        out,
        scratch,
        no_rope_args(),
        stream,
    )


def prompt_attention(
    flash,
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
    stream=0,
) -> None:
    """Rows first_token on of a step too long for the scratch: attention_flash's kernel with
    flash where it takes the cache and shape, else the prefill kernel (the decode bits)."""
    from vtllm.kernels.cuda import attention_flash
    from vtllm.kernels.cuda.attention_prefill import prefill_attention

    Hq, D = q.shape[1], q.shape[2]
    if flash and attention_flash.supports(k_cache, Hq, k_cache.shape[2], D):
        run = attention_flash.flash_prefill
    else:
        run = prefill_attention
    run(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        out,
        first_token=first_token,
        stream=stream,
    )


def no_rope_args() -> tuple:
    """The split kernel's rope arguments for a launch without rope (never read)."""
    i32, f32 = placeholder(np.int32), placeholder(np.float32)
    return (i32, i32, placeholder(np.float32, 2), f32, f32, np.float32(0.0), False)


def fuses_rope(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether rope_attention takes this shape: split attention's, with heads of whole warps
    that divide the block (each thread then holds one dim of every head it touches)."""
    return (
        supports(num_heads, num_kv_heads, head_dim)
        and head_dim % 32 == 0
        and THREADS % head_dim == 0  # so a power of two
    )


def rope_attention(
    qkv,
    k_cache,
    v_cache,
    slot_mapping,
    positions,
    cos_sin,
    eps,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    out,
    scratch,
    *,
    q_norm=None,
    k_norm=None,
    stream=0,
) -> None:
    """qkv_rope.qkv_rope then attention.paged_attention in one kernel (and the combine), for
    steps in which every sequence has one new token: each block norms and rotates its own
    query heads from qkv [T, (Hq + 2 Hk) D], and the block that reads a row's newest key
    makes that key (norm, rotation) and writes it and the row's v into the cache first. The
    same code on the same values as the two kernels: the same q, cache and out bits. Rows of
    a sequence with more new tokens are left unwritten in out (their keys would come from
    other blocks: the two kernels serve such steps). scratch: make_scratch's pair with at
    least T rows. Arguments as those of the two functions; out [T, Hq, D]."""
    rope = checked_rope_args(
        qkv,
        k_cache,
        v_cache,
        slot_mapping,
        positions,
        cos_sin,
        eps,
        block_tables,
        seq_lens,
        query_start_loc,
        out,
        scratch,
        q_norm,
        k_norm,
    )
    if rope is not None:
        _launch(
            _split_rope_kernel,
            qkv,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            query_start_loc,
            scale,
            out,
            scratch,
            rope,
            stream,
        )


def checked_rope_args(
    qkv,
    k_cache,
    v_cache,
    slot_mapping,
    positions,
    cos_sin,
    eps,
    block_tables,
    seq_lens,
    query_start_loc,
    out,
    scratch,
    q_norm,
    k_norm,
):
    """rope_attention's argument checks (ValueError on what it cannot take); the split
    kernel's rope arguments, or None when there is nothing to do."""
    check_attention(
        "rope_attention", out, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc
    )
    has_norm = check_qkv_rope(
        "rope_attention",
        qkv,
        out,
        k_cache,
        v_cache,
        slot_mapping,
        positions,
        cos_sin,
        q_norm,
        k_norm,
    )
    T, Hq, D = out.shape
    if not fuses_rope(Hq, k_cache.shape[2], D):
        raise ValueError(
            f"rope_attention: {Hq} heads over {k_cache.shape[2]} kv heads of "
            f"{D} dims are not supported (fuses_rope)"
        )
    if not _fits_scratch(scratch, T, Hq, D):
        raise ValueError(
            f"rope_attention: scratch must be make_scratch's pair for at least "
            f"{T} rows of {Hq} heads of {D} dims"
        )
    if T == 0 or seq_lens.shape[0] == 0:
        return None
    if not has_norm:
        q_norm = k_norm = placeholder(np.float32)  # never read
    return (slot_mapping, positions, cos_sin, q_norm, k_norm, np.float32(eps), has_norm)
