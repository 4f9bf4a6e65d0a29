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
is the in-order fold of its splits' states, always through `_fold` (_attention_common):
  - here (decode_attention, for rows that fit the scratch): splits spread over blocks (about
    TARGET_BLOCKS in all), partial states to scratch, then `_combine_kernel` folds them in
    split order: the GPU is filled even at batch 1;
  - longer steps (prefill): _attention_prefill's kernel, whose blocks each take several tokens
    of a sequence through the same phases on the same helpers (one load of a split serves
    them all) and fold each row's splits in order as they go.
Both paths run the same code on the same keys in the same order, so a token's output does not
depend on the path, the batch or the chunking (the depth-2 law needs that on the GPU too).
Which of them runs for which rows is attention.paged_attention's choice.

A block checks the block-table entries of its own splits as it loads them (a bad one marks
the split, and the combine then leaves the row unwritten), and reads a decode row's metadata
in one trip (_row): two round trips to memory fewer before the keys arrive.

rope_attention runs qkv_rope's work inside the split kernel for steps of one token per
sequence: each warp norms and rotates one head in registers (_rope_head), and the block that
reads a row's newest key makes that key and writes it to the cache. Kept small on purpose:
in a kernel that runs most of its instructions once, time follows code size more than work
(likely instruction fetch), so the rope work stays in registers, a head a warp, rather than
going through shared memory in unrolled items, which doubles the code.

Variants (compiled apart, _split_kernel(rope, masked, dim)): masked takes a window and a cap
(_attention_common: its blocks start at the window's first split, keys before the window score
-inf); dim = WIDE_DIM (heads of 256) lays the shared array out for 256-dim rows, dynamic since
it passes 48 KB (~78 KB), and loads a key in two passes of 128 dims; rope only at MAX_DIM.

Over 400 lines: one kernel (the factory of its variants is ~190 lines) with its phase helpers
and launchers; its shared geometry and fold already live in _attention_common.
"""

import functools
import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._attention_common import (
    MAX_DIM,
    MAX_GROUP,
    SPLIT,
    WIDE_DIM,
    _fits_scratch,
    _row,
    _slot_of_slot,
    block_shift,
    capped,
    check_attention,
    combine,
    dim_for,
    row_for,
    split_loader,
    supports,
    window_start,
)
from vtllm.kernels.cuda._device import NEG_INF, SIMULATOR, imin, warp_max, warp_sum
from vtllm.kernels.cuda._host import allow_dynamic_shared, placeholder
from vtllm.kernels.cuda._kv_cache import kv_rounded, kv_store
from vtllm.kernels.cuda._ptx import grid_dependency_sync, prefetch_l1
from vtllm.kernels.cuda._ptx_shared import shared_f32x4, store_f32x4
from vtllm.kernels.cuda._qkv_rope import (
    _head_values,
    _rope_head,
    _weight_values,
    check_qkv_rope,
)

WARPS = 4
THREADS = 32 * WARPS
# decode grid size to aim for: a few blocks an SM, chosen by a sweep of grid sizes (larger
# grids only add blocks that loop over fewer splits; BENCHMARKS.md, Kernels)
TARGET_BLOCKS = 512
# a cap of 128 registers lets four blocks share an SM at the cost of a few spills
# (tools/kernel_report.py); the extra warps hide more of the load latency than the spills
# cost, unlike the compiler's own choice (bench/gpu_attention.py)
_REGISTERS = {} if SIMULATOR else {"max_registers": 128}
# the wide variants' shared array (~78 KB) lets two blocks share an SM whatever their
# registers: 168 keep them free of spills (128 spilled up to 268 bytes a thread)
_REGISTERS_WIDE = {} if SIMULATOR else {"max_registers": 168}


def layout(dim: int) -> dict:
    """One shared array carved into regions for heads of up to dim dims (a single array starts
    at the block's shared base, so every region is 16-byte aligned: all offsets are multiples
    of 4 floats). _attention_prefill lays out its own regions and loads K and V with
    split_loader too."""
    row = row_for(dim)
    at = {"row": row, "q": 0}  # scaled queries [MAX_GROUP, dim]
    at["k"] = at["q"] + MAX_GROUP * dim  # the split's keys [SPLIT, row]
    at["v"] = at["k"] + SPLIT * row  # and values
    at["p"] = at["v"] + SPLIT * row  # probabilities [MAX_GROUP, SPLIT]
    at["m"] = at["p"] + MAX_GROUP * SPLIT  # the split's max and sum per head
    at["l"] = at["m"] + MAX_GROUP
    at["new_k"] = at["l"] + MAX_GROUP  # rope_attention: the row's new key and value as the
    at["new_v"] = at["new_k"] + dim  # cache holds them
    at["words"] = at["new_v"] + dim
    return at


SMEM_WORDS = layout(MAX_DIM)["words"]  # the narrow variants' static shared array
WIDE_SHARED_BYTES = 4 * layout(WIDE_DIM)["words"]  # the wide ones' dynamic one (~78 KB)


@functools.cache
def _phase_helpers(dim: int, masked: bool):
    """(load, score, weighted_columns, stage_queries): the phases' device helpers for heads of
    up to dim dims (module docstring); masked: the loader's (split_loader)."""
    at = layout(dim)
    ROW, Q_AT, K_AT, V_AT = at["row"], at["q"], at["k"], at["v"]
    q_per_thread = MAX_GROUP * dim // THREADS  # query values a thread loads (at most)
    load = split_loader(WARPS, K_AT, V_AT, ROW, dim // MAX_DIM, masked)

    @cuda.jit(device=True)
    def score(smem, q_at, j, D):
        """q . k_j from shared memory (the query row at q_at), four partial sums."""
        k_at = K_AT + j * ROW
        a0 = a1 = a2 = a3 = np.float32(0.0)
        # dims in order; 32 per trip when D is a multiple of 32, so that the inner loop's 8
        # steps unroll with constant offsets from running ones (a loop of D / 4 steps does
        # not, and pays address math every step), and unit-step counters (a stepped range
        # keeps a 64-bit one with a sign test per trip)
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
    def weighted_columns(smem, p_at, d):
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
    def stage_queries(smem, qv, G, D, scale, tid):
        """qv (item i: e = tid + i THREADS of the block's G D query values, head e // D, dim
        e % D: stepped, not divided) scaled into the Q region."""
        g, d = tid // D, tid % D
        for i in range(q_per_thread):
            if g < G:
                smem[Q_AT + g * dim + d] = qv[i] * scale
            g, d = g + THREADS // D, d + THREADS % D
            if d >= D:
                g, d = g + 1, d - D

    return load, score, weighted_columns, stage_queries


@cuda.jit(device=True)
def _dot_step(smem, q_at, k_at, d, a0, a1, a2, a3):
    """The four partial sums of q . k advanced by dims d .. d + 3."""
    q0, q1, q2, q3 = shared_f32x4(smem, q_at + d)
    k0, k1, k2, k3 = shared_f32x4(smem, k_at + d)
    return a0 + q0 * k0, a1 + q1 * k1, a2 + q2 * k2, a3 + q3 * k3


@functools.cache
def _split_kernel(rope: bool, masked: bool, dim: int):
    """The split kernel (module docstring) for heads of up to dim dims; with rope it reads q
    from qkv and does qkv_rope's work for its row first (rope_attention); masked: it takes
    the window and the cap (_attention_common), else ignores them."""
    _load_split, _score, _weighted_columns, _stage_queries = _phase_helpers(dim, masked)
    at = layout(dim)
    ROW, Q_AT, K_AT, V_AT, P_AT = at["row"], at["q"], at["k"], at["v"], at["p"]
    M_AT, L_AT, NEW_K_AT, NEW_V_AT = at["m"], at["l"], at["new_k"], at["new_v"]
    static_words = at["words"] if dim == MAX_DIM else 0  # 0: dynamic (WIDE_SHARED_BYTES)
    q_per_thread = MAX_GROUP * dim // THREADS

    @cuda.jit(cache=True, **(_REGISTERS if dim == MAX_DIM else _REGISTERS_WIDE))
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
        window,
        cap,
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
            qv = cuda.local.array(q_per_thread, float32)
            for i in range(q_per_thread):
                e = tid + i * THREADS
                if e < G * D:
                    qv[i] = q[t, hk * G * D + e]
        s, n_keys = _row(query_start_loc, seq_lens, block_tables, t, bs)
        n_splits = (n_keys + SPLIT - 1) // SPLIT
        sp_first, key_first = 0, 0  # the window's first split and key (masked)
        if masked:
            key_first = window_start(n_keys, window)
            sp_first = key_first // SPLIT
        if s < 0 or z >= n_splits - sp_first:
            return
        smem = cuda.shared.array(static_words, float32)
        shift = block_shift(bs)
        if rope:
            if query_start_loc[s + 1] - query_start_loc[s] != 1:  # not a one-token row
                if z == 0 and tid < G:  # a negative sum: the combine leaves the row unwritten
                    part_ml[t, hk * G + tid, sp_first, 1] = -1.0
                return
            # the first split's block-table entry is read after the work below: into L1 now
            lo = (sp_first + z) * SPLIT
            prefetch_l1(block_tables, s, lo >> shift if shift >= 0 else lo // bs)
            writer = (n_splits - 1 - sp_first) % nz == z  # the block whose splits hold the key
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
                            smem[Q_AT + g * dim + 32 * c + lane] = x[c] * scale
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
        for sp in range(sp_first + z, n_splits, nz):
            lo = sp * SPLIT
            n_here = imin(n_keys - lo, SPLIT)
            bad = _load_split(
                k_cache,
                v_cache,
                block_tables,
                s,
                hk,
                lo,
                n_here,
                key_first,
                w,
                lane,
                D,
                smem,
                shift,
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
                if g < G and lane < n_here and (not masked or lo + lane >= key_first):
                    score = _score(smem, Q_AT + g * dim, lane, D)
                    if masked and cap > 0:
                        score = capped(score, cap)
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


_split_kernel_plain = _split_kernel(False, False, MAX_DIM)  # (tools/kernel_report.py names)
_split_rope_kernel = _split_kernel(True, False, MAX_DIM)


def _launch(
    rope,
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
    window,
    softcap,
    stream,
) -> None:
    """The split kernel over one block per (row, kv head, z), then the combine."""
    T, Hq, D = out.shape
    Hk, bs = k_cache.shape[2], k_cache.shape[1]
    part_acc, part_ml = scratch[0][:T], scratch[1][:T]
    # enough blocks to fill the GPU, each looping over splits z, z + nz, ...: with one block
    # per split of the longest context, a batch of short rows launches mostly empty blocks
    nz = min(part_acc.shape[2], max(1, -(-TARGET_BLOCKS // (T * Hk))))
    dim = dim_for(D)
    kernel = _split_kernel(rope, bool(window or softcap), dim)
    args = (
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
        np.int32(window),
        np.float32(softcap),
    )
    nbytes = 0 if dim == MAX_DIM else WIDE_SHARED_BYTES
    allow_dynamic_shared(kernel, args, nbytes)
    kernel[(T, Hk, nz), THREADS, stream, nbytes](*args)
    combine(part_acc, part_ml, block_tables, seq_lens, query_start_loc, bs, out, window, stream)


def decode_attention(
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
    window=0,
    softcap=0.0,
    stream=0,
) -> None:
    """Rows of q [T, Hq, D] through the split kernel and the combine into out, their split
    states in scratch (make_scratch's pair for at least T rows); the arguments as
    attention.paged_attention's, which checked them."""
    T, Hq, D = q.shape
    _launch(
        False,
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
        window,
        softcap,
        stream,
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
    window=0,
    softcap=0.0,
    stream=0,
) -> None:
    """qkv_rope.qkv_rope then attention.paged_attention in one kernel (and the combine), for
    steps in which every sequence has one new token: each block norms and rotates its own
    query heads from qkv [T, (Hq + 2 Hk) D], and the block that reads a row's newest key
    makes that key (norm, rotation) and writes it and the row's v into the cache first. The
    same code on the same values as the two kernels: the same q, cache and out bits. Rows of
    a sequence with more new tokens are left unwritten in out (their keys would come from
    other blocks: the two kernels serve such steps). scratch: make_scratch's pair with at
    least T rows. Arguments as those of the two functions (window and softcap as
    paged_attention's); out [T, Hq, D]."""
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
            True,
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
            window,
            softcap,
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
