"""What the attention kernels share: the metadata walk, the split geometry and the fold of split
states that keep every path's bits alike, and the decode paths' scratch and combine.

A row's keys are cut into splits of SPLIT positions; a split's state (max m, sum l, acc) is a
function of its keys only, and a row's result is the in-order fold of its splits' states, always
through _fold (_fold_weights and _fold_acc, whose two-product sums are pinned with fma32). The
decode kernels (_attention_split, _attention_ring) write a row's split states to the scratch
(make_scratch) and _combine_kernel folds them; the prefill kernel (_attention_prefill) folds them
as it goes, on the same helpers. split_loader is the split's load phase of both the split and
the prefill kernels.

Windows and caps (Gemma, Mistral, Phi-3): a row of n keys with a sliding window sees keys
window_start(n, window) .. n - 1 (first_split's split on), and a score soft-cap turns each score
s into capped(s, cap) before the softmax. Each kernel of the family has a `masked` variant that
takes both as runtime values (window 0: none; cap 0: none): a key before the window gets score
-inf, as a key past the row's end does, so a split's state stays a function of its keys and the
row; a split wholly before the window holds no key of the row: the decode kernels do not visit
it, the combine starts at first_split, and the prefill kernel folds its empty state (an
identity). The plain variants are compiled without either. Heads of up to MAX_DIM dims use
the narrow variants; WIDE_DIM (Gemma's 256) the wide ones (dim_for): shared rows of
row_for(dim), and a lane takes dims 4l .. 4l + 3 of every 128 (split_loader's passes).
Hot path: keep it lean.
"""

import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels import check_attention_shapes
from vtllm.kernels.cuda._device import NEG_INF, fma32, fmax, imin
from vtllm.kernels.cuda._host import check
from vtllm.kernels.cuda._kv_cache import check_kv, kv_value4_at
from vtllm.kernels.cuda._ptx import grid_dependency_sync, item_at
from vtllm.kernels.cuda._ptx_shared import store_shared_f32x4

MAX_THREADS = 512  # so head_dim <= 512 (over 64 registers a thread: 1024 would not fit an SM)


@cuda.jit(device=True)
def _sequence_of(query_start_loc, t):
    """s with query_start_loc[s] <= t < query_start_loc[s+1], or -1 (binary search; the same
    answer in every thread of the block)."""
    lo, hi = 0, query_start_loc.shape[0] - 1
    if hi < 1 or t < query_start_loc[0] or t >= query_start_loc[hi]:
        return -1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if query_start_loc[mid] <= t:
            lo = mid
        else:
            hi = mid
    return lo


def check_attention(op, q, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc):
    """paged_attention's argument checks (dtypes, shapes), under the name op."""
    check(op, "q", q, np.float32, 3)
    check(op, "out", out, np.float32, 3)
    check_kv(op, k_cache, v_cache)
    check(op, "block_tables", block_tables, np.int32, 2)
    check(op, "seq_lens", seq_lens, np.int32, 1)
    check(op, "query_start_loc", query_start_loc, np.int32, 1)
    check_attention_shapes(op, q, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    d = q.shape[2]
    if d > MAX_THREADS:
        raise ValueError(f"{op}: head_dim {d} > {MAX_THREADS} is not supported")


SPLIT = 32  # keys per split: one per lane in the score phase


MAX_GROUP = 8  # query heads per kv head


MAX_DIM = 128  # head_dim of the narrow variants: lane l loads dims 4l .. 4l + 3
WIDE_DIM = 256  # of the wide ones (Gemma): lane l loads dims 4l .. 4l + 3 and 128 on


def dim_for(head_dim: int) -> int:
    """The variant's dims for a head of head_dim (supports() says which it takes)."""
    return MAX_DIM if head_dim <= MAX_DIM else WIDE_DIM


def row_for(dim: int) -> int:
    """Shared row stride in floats: a multiple of 4 (128-bit accesses), and 4 mod 32 so that
    the eight lanes of a quarter-warp reading one 128-bit piece of eight rows hit all 32
    banks."""
    return dim + 4


ROW = row_for(MAX_DIM)


def splits_for(max_positions: int) -> int:
    return -(-max_positions // SPLIT)


@cuda.jit(device=True)
def window_start(n_keys, window):
    """The first key a row of n_keys keys sees through a window of `window` keys (0: all)."""
    return n_keys - window if window > 0 and n_keys > window else 0


@cuda.jit(device=True)
def first_split(n_keys, window):
    """The first split that holds a key of the row's window."""
    return window_start(n_keys, window) // SPLIT


@cuda.jit(device=True)
def capped(score, cap):
    """score soft-capped as _attention_paged and the CPU kernels cap it (cap > 0)."""
    return np.float32(math.tanh(score / cap)) * cap


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


def split_loader(
    warps: int, k_at: int, v_at: int, row: int = ROW, passes: int = 1, masked: bool = False
):
    """Phase 1 for a block of `warps` warps whose shared K and V rows (row floats apart) start
    at k_at and v_at: load(k_cache, v_cache, block_tables, s, hk, lo, n_here, first, w, lane,
    D, smem, shift) puts keys lo .. lo + n_here - 1 into rows 0 .. n_here - 1 of K and V (warp
    w keys w, w + warps, .., lane l dims 128 i + 4l .. + 3 in pass i < passes). Rows past
    n_here repeat key lo (finite values that p = 0 will weigh), so no branch depends on the
    key; masked, keys before `first` (the window's first key) are read as that key instead:
    their block-table entries may be the null block of freed window blocks
    (scheduler/sliding_window), whose values nothing has written, and 0 * a NaN would reach
    p @ V.
    Fixed trip counts: unrolled, a pass's loaded rows live in registers and all its loads are
    in flight before its first store. shift: block_shift(block size). Returns 1 where a key's
    block-table entry is outside the cache (its rows then hold block 0's values), else 0: the
    split's own check, made in the same trip as the loads."""
    keys_per_warp = SPLIT // warps
    assert keys_per_warp * warps == SPLIT

    @cuda.jit(device=True)
    def load(k_cache, v_cache, block_tables, s, hk, lo, n_here, first, w, lane, D, smem, shift):
        num_blocks, bs, Hk = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
        bad = 0
        for p in range(passes):
            d = 4 * lane + 128 * p
            if d < D:
                # a slot's K (and V) row is one run of Hk D values: this lane's 4 start at
                # head_at
                slot_values, head_at = np.int32(Hk * D), np.int32(hk * D + d)
                kr = cuda.local.array((keys_per_warp, 4), float32)
                vr = cuda.local.array((keys_per_warp, 4), float32)
                table_at = s * block_tables.shape[1]  # the sequence's row of the block table
                for i in range(keys_per_warp):
                    jj = w + warps * i
                    j = np.int32(lo + (jj if jj < n_here else 0))
                    if masked and j < first:
                        j = np.int32(first)
                    e, off = _slot_of_slot(j, bs, shift)
                    blk = item_at(block_tables, table_at + e)
                    if blk < 0 or blk >= num_blocks:
                        blk, bad = 0, 1
                    at = np.int32(blk * bs + off) * slot_values + head_at  # 64-bit: > 8 GB
                    kr[i, 0], kr[i, 1], kr[i, 2], kr[i, 3] = kv_value4_at(k_cache, at)
                    vr[i, 0], vr[i, 1], vr[i, 2], vr[i, 3] = kv_value4_at(v_cache, at)
                for i in range(keys_per_warp):
                    at = (w + warps * i) * row + d
                    store_shared_f32x4(smem, k_at + at, kr[i, 0], kr[i, 1], kr[i, 2], kr[i, 3])
                    store_shared_f32x4(smem, v_at + at, vr[i, 0], vr[i, 1], vr[i, 2], vr[i, 3])
        return bad

    return load


def _combine_kernel_for(windowed: bool):
    """The combine; windowed: it starts at each row's first_split (the decode kernels wrote
    no state before it)."""

    @cuda.jit(cache=True)
    def kernel(part_acc, part_ml, block_tables, seq_lens, query_start_loc, bs, window, out):
        """Folds a row's split states in split order; eight splits' values are loaded before
        they are folded, so the loads overlap instead of queueing behind each fold."""
        grid_dependency_sync()
        t, h, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        s, n_keys = _row(query_start_loc, seq_lens, block_tables, t, bs)
        if s < 0 or tid >= out.shape[2]:
            return
        n = (n_keys + SPLIT - 1) // SPLIT
        start = first_split(n_keys, window) if windowed else 0
        m, l, a = NEG_INF, np.float32(0.0), np.float32(0.0)
        pm = cuda.local.array(8, float32)
        pl = cuda.local.array(8, float32)
        pa = cuda.local.array(8, float32)
        for sp0 in range(start, n, 8):
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

    return kernel


_combine_kernels = {False: _combine_kernel_for(False), True: _combine_kernel_for(True)}
_combine_kernel = _combine_kernels[False]


def combine(part_acc, part_ml, block_tables, seq_lens, query_start_loc, bs, out, window, stream):
    """The combine over rows of out [T, Hq, D] (their states in part_acc, part_ml)."""
    T, Hq, D = out.shape
    _combine_kernels[window > 0][(T, Hq), max(32, -(-D // 32) * 32), stream](
        part_acc, part_ml, block_tables, seq_lens, query_start_loc, bs, np.int32(window), out
    )


def supports(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether the split, ring and prefill kernels take the shape: heads of up to MAX_DIM dims
    (a multiple of 4) or of WIDE_DIM, GQA groups of up to MAX_GROUP query heads."""
    narrow = head_dim <= MAX_DIM and head_dim % 4 == 0
    return (narrow or head_dim == WIDE_DIM) and num_heads // num_kv_heads <= MAX_GROUP


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
