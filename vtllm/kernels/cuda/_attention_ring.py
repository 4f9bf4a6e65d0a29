"""Paged attention over key splits for decode steps, each warp of a block streaming its own
splits through a ring in shared memory: _attention_split's decode kernel with its sums, so its
bits. Hot path: keep it lean.

attention.paged_attention runs it for steps of RING_MIN_ROWS query rows or more (batched
decode), and for the leading rows of steps too long for the scratch; below RING_MIN_ROWS, and
for rope_attention (one-row steps), the split kernel stays: same entry points
(decode_attention, rope_attention, TARGET_BLOCKS), same bits, so either can serve any step.
Why a second kernel: the split kernel works a split across its whole block in three phases
with four block barriers, reads each K row from shared memory once per query head and passes
every K and V value through registers and shared memory. Here each warp streams its own splits
with warp barriers only. The kernel is bound by latency and by its instruction count, not
by bytes in flight, so what matters is: small ring items (whole-split stages take so much
shared memory that too few warps fit an SM to hide the loads), few instructions a byte (one
16-byte copy a piece, few items a split, the dot steps written out: numba keeps a loop of
them a loop, with 64-bit counters and address math at every step) and few registers (at 128,
four blocks share an SM). With a warp a split it leaves most SMs idle at one row, so the split
kernel keeps small steps (attention.RING_MIN_ROWS; BENCHMARKS.md, Kernels).

A block serves one query token and one kv head (the GQA group's G query heads share every K
and V load). It stages the scaled queries in shared memory once; then each warp works alone
on splits z warps + w, + nz warps, .. with warp barriers only. A split's K and V reach the
warp's ring of `stages` stages by cp.async as the cache stores them (float32 or bf16 bits),
in pieces of 16 bytes (4 float32 or 8 bf16 values: piece_values; a bf16 head whose rows are
not whole 16-byte pieces takes 8-byte pieces of 4) and in items of whole pieces:
ceil(D / CHUNK) K items of CHUNK = K_PIECES pieces' dims of all 32 keys (32 float32 dims, 64
bf16 ones), then SPLIT / V_KEYS V items of V_KEYS keys' V rows (8 keys of float32, 16 of
bf16). Both cache types thus move a split in 4.6 KB K items and 4 KB V items at 128 dims:
a bf16 split is 2 K and 2 V items, 32 copies a lane, where 8-byte pieces took 4 and 4, and
64; each item costs a wait, two warp barriers and its address math, each copy a shuffle and
its address. The warp refills a stage with the item `stages` on as soon as it has read it
(the next split's first items during this split's p @ V).
  - scores: lane j takes key j and sums q_g . k_j for all G heads over each K item's dims
    (k_j read once, each query value read by all lanes at once: a broadcast), then per head
    the split's max and sum of exp by warp_max and warp_sum, p to the warp's shared row;
  - p @ V: lane l sums columns 4l .. 4l + 3 of V for all G heads over each V item's keys.
These are _attention_split's sums in its order (q . k: four partial sums over dims in order,
one per residue class mod 4; the softmax over the split's keys in lane order; p @ V: keys in
order), and the split states go to the same scratch for the same combine: a token's output
has the same bits through either kernel, and through the prefill one.

rope_attention: the block's first warps norm and rotate its query heads (and the writer block
its row's new key and v, stored to the cache) as _attention_split's does; the block barrier
after that orders the store before its warps' copies (cp.async reads are ordinary weak loads;
the split kernel's ld.global.nc loads are not, so it patches the key in shared memory).

Variants: masked (a window and a cap, _attention_common: a warp's splits start at the window's
first split, keys before the window score -inf and their copies read the window's first key)
and heads of 256 (WIDE_DIM: more K items a split, and a lane sums columns 4l .. 4l + 3 and
128 + 4l .. for p @ V); the other constants of a kernel as before (_kernel).

Over 400 lines: one kernel whose factory (~250 lines) holds the ring's protocol, with the
device helpers of its stages beside it (made per piece size, _piece_helpers); the geometry,
fold and combine it shares with the split kernel live in _attention_common.
"""

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from vtllm.kernels.cuda._attention_common import (
    MAX_DIM,
    MAX_GROUP,
    SPLIT,
    _row,
    _slot_of_slot,
    block_shift,
    capped,
    combine,
    window_start,
)
from vtllm.kernels.cuda._attention_split import checked_rope_args, no_rope_args
from vtllm.kernels.cuda._device import (
    NEG_INF,
    SIMULATOR,
    imin,
    lane_value,
    sync_warp,
    warp_max,
    warp_sum,
)
from vtllm.kernels.cuda._host import allow_dynamic_shared
from vtllm.kernels.cuda._kv_cache import (
    kv_copy4_async,
    kv_copy8_async,
    kv_shared4,
    kv_shared8,
    kv_store,
    kv_words4,
)
from vtllm.kernels.cuda._ptx import (
    copy_async_commit,
    copy_async_waiter,
    grid_dependency_sync,
    item_at,
)
from vtllm.kernels.cuda._ptx_shared import shared_f32x4, store_f32x4
from vtllm.kernels.cuda._qkv_rope import _head_values, _rope_head, _weight_values

K_PIECES = 8  # pieces of a K ring item's row (SPLIT rows of them)
# (warps a block, ring stages a warp, registers a thread) by cache type. A stage holds a K item
# (32 keys x 8 pieces and a padding piece: 4.6 KB in either type) or a V item (4 KB). The
# kernel needs 126 registers without spills at a cap of 128 (tools/kernel_report.py), so
# four blocks of 4 warps fit an SM by registers (16 warps), and two stages (40 KB a block)
# leave room for them where three (59 KB) would not: an SM then keeps 16 items of 4.6 KB in
# flight while its warps read, about what 12 warps with three 2.3 KB items ahead each did.
# float32 keeps 3 stages at 168 registers (12 warps).
GEOMETRY = {np.float32: (4, 3, 168), np.uint16: (4, 2, 128)}
if SIMULATOR:
    GEOMETRY = {np.float32: (2, 3, 0), np.uint16: (2, 2, 0)}
Q_ITEMS = MAX_GROUP * MAX_DIM // 64  # query values a thread loads, at most (2 warps a block)
SUMS = 4 * MAX_GROUP  # register arrays (numba needs plain constants): four sums a head
STATES = 2 * MAX_GROUP  # a split's max and sum per head
# decode grid size to aim for: about four blocks an SM on a 132-SM GPU (as many as fit at
# once with a bf16 cache, three with float32); chosen by a sweep of grid sizes (BENCHMARKS.md,
# Kernels)
TARGET_BLOCKS = 528


def piece_values(head_dim: int, itemsize: int) -> int:
    """Cache values a ring piece holds: 16 bytes (4 float32, 8 bf16), or 4 bf16 (8 bytes)
    for a head whose rows are not whole 16-byte pieces."""
    return 8 if itemsize == 2 and head_dim % 8 == 0 else 4


def _geometry(head_dim: int, itemsize: int) -> tuple[int, int, int]:
    """(values a piece, K item dims CHUNK, V item keys V_KEYS) (module docstring)."""
    values = piece_values(head_dim, itemsize)
    return values, K_PIECES * values, 2 * values


def _items(head_dim: int, itemsize: int) -> int:
    """Ring items a split: its K items, then its V items."""
    _, chunk, v_keys = _geometry(head_dim, itemsize)
    return -(-head_dim // chunk) + SPLIT // v_keys


def _stages(head_dim: int, itemsize: int, stages: int) -> int:
    """A ring's stages: the geometry's, at most a split's items (the prologue copies one
    split's first items)."""
    return min(stages, _items(head_dim, itemsize))


def _stage_words(head_dim: int, itemsize: int) -> int:
    """A ring stage in words: a K item (SPLIT rows of K_PIECES pieces and a padding piece) or
    a V item (V_KEYS rows of head_dim values), whichever is larger."""
    values, _, v_keys = _geometry(head_dim, itemsize)
    piece = values * itemsize // 4
    return max(SPLIT * (K_PIECES + 1) * piece, v_keys * head_dim * itemsize // 4)


def shared_bytes(group: int, head_dim: int, itemsize: int, warps: int, stages: int) -> int:
    """Dynamic shared memory a block: the queries, each warp's probabilities and ring."""
    ring = _stages(head_dim, itemsize, stages) * _stage_words(head_dim, itemsize)
    return 4 * (group * head_dim + warps * (group * SPLIT + ring))


@cuda.jit(device=True)
def _key_row(block_tables, table_at, key, bs, shift, num_blocks, Hk, hk):
    """(the cache row of a key of this kv head: (block * bs + offset) * Hk + hk, 1 where its
    block-table entry is outside the cache (the row is then block 0's) else 0)."""
    e, off = _slot_of_slot(key, bs, shift)
    blk = item_at(block_tables, table_at + e)
    bad = 0
    if blk < 0 or blk >= num_blocks:
        blk, bad = 0, 1
    return np.int32((blk * bs + off) * Hk + hk), bad


@cuda.jit(device=True)
def _dot4(fs, ws, cache, k_at, q_at, D, group, sc):
    """sc[4 g + c] += q_g[d + c] * k[d + c] for a four-value piece of k at ws[k_at ..] and of
    each query head g at fs[q_at + g D ..]."""
    k0, k1, k2, k3 = kv_shared4(cache, ws, k_at)
    for g in range(group):
        q0, q1, q2, q3 = shared_f32x4(fs, q_at + g * D)
        sc[4 * g] += q0 * k0
        sc[4 * g + 1] += q1 * k1
        sc[4 * g + 2] += q2 * k2
        sc[4 * g + 3] += q3 * k3


@cuda.jit(device=True)
def _dot8(fs, ws, cache, k_at, q_at, D, group, sc):
    """_dot4 over an eight-value (bf16) piece: dims d .. d + 3, then d + 4 .. d + 7 into the
    same four sums, so each sum still takes its dims in order."""
    k0, k1, k2, k3, k4, k5, k6, k7 = kv_shared8(cache, ws, k_at)
    for g in range(group):
        q0, q1, q2, q3 = shared_f32x4(fs, q_at + g * D)
        q4, q5, q6, q7 = shared_f32x4(fs, q_at + 4 + g * D)
        sc[4 * g] += q0 * k0
        sc[4 * g + 1] += q1 * k1
        sc[4 * g + 2] += q2 * k2
        sc[4 * g + 3] += q3 * k3
        sc[4 * g] += q4 * k4
        sc[4 * g + 1] += q5 * k5
        sc[4 * g + 2] += q6 * k6
        sc[4 * g + 3] += q7 * k7


@cuda.jit(device=True)
def _softmax(sc, ml, fs, p_at, valid, lane, group):
    """Per head g: the split's max and sum of exp (ml[2 g], ml[2 g + 1]) of the scores (sc's
    four partial sums; -inf where not valid) by warp_max and warp_sum over its keys in lane
    order, and p_g to fs[p_at + g SPLIT + lane]. Every lane of the warp calls it."""
    for g in range(group):
        score = NEG_INF
        if valid:
            score = (sc[4 * g] + sc[4 * g + 1]) + (sc[4 * g + 2] + sc[4 * g + 3])
        m = warp_max(score)
        p = math.exp(score - m) if score != NEG_INF else np.float32(0.0)
        ml[2 * g], ml[2 * g + 1] = m, warp_sum(p)
        fs[p_at + g * SPLIT + lane] = p


@cuda.jit(device=True)
def _softmax_capped(sc, ml, fs, p_at, valid, lane, group, cap):
    """_softmax of the capped scores (_attention_common.capped; cap > 0 a runtime value)."""
    for g in range(group):
        score = NEG_INF
        if valid:
            score = (sc[4 * g] + sc[4 * g + 1]) + (sc[4 * g + 2] + sc[4 * g + 3])
            if cap > 0:
                score = capped(score, cap)
        m = warp_max(score)
        p = math.exp(score - m) if score != NEG_INF else np.float32(0.0)
        ml[2 * g], ml[2 * g + 1] = m, warp_sum(p)
        fs[p_at + g * SPLIT + lane] = p


@cuda.jit(device=True)
def _four_keys(fs, ws, cache, v_at, p_at, v_row, group, acc, ps):
    """acc[4 g + e] += p_g[j] * V[j, e] over four keys j in order (columns' step), p read
    into ps first."""
    for g in range(group):
        ps[4 * g], ps[4 * g + 1], ps[4 * g + 2], ps[4 * g + 3] = shared_f32x4(fs, p_at + g * SPLIT)
    for u in range(4):
        v0, v1, v2, v3 = kv_shared4(cache, ws, v_at + u * v_row)
        for g in range(group):
            p = ps[4 * g + u]
            acc[4 * g] += p * v0
            acc[4 * g + 1] += p * v1
            acc[4 * g + 2] += p * v2
            acc[4 * g + 3] += p * v3


@cuda.jit(device=True)
def _next_stage(at, ring, ring_end, stage_words):
    """The ring stage after the one at ws[at ..]: kept as a running address, since item i's
    stage worked out as i mod stages costs a 64-bit division an item."""
    at += stage_words
    return ring if at == ring_end else at


@functools.cache
def _piece_helpers(values: int):
    """(copy_item, refill, dot_chunk, columns): the device helpers of a ring whose pieces hold
    `values` cache values (piece_values), the piece's copy and read chosen here (a kernel's
    constants; numba types every branch, so the choice cannot be a branch inside them)."""
    copy = kv_copy8_async if values == 8 else kv_copy4_async
    dot = _dot8 if values == 8 else _dot4
    chunk, v_keys = K_PIECES * values, 2 * values

    @cuda.jit(device=True)
    def copy_item(k_cache, v_cache, ws, at, row, lane, D, sub, live):
        """Ring item `sub` of a split into the stage at ws[at ..], lane j holding key j's
        cache row in `row`: sub < K items: dims chunk sub .. of all 32 keys (K rows of
        K_PIECES + 1 pieces, the last one padding: a lane reading piece u of its key then
        meets no other lane on its bank); after them, V item v: the V rows of keys v_keys v ..
        (rows of D / values pieces). Each pass of the warp copies 32 pieces, whole rows of
        them. live False: nothing read, zeros written (the lanes still trade rows: the
        simulator's exchange needs every lane)."""
        words = kv_words4(k_cache) * (values // 4)  # a piece's words
        d32 = np.int32(D)
        k_items = (D + chunk - 1) // chunk
        if sub < k_items:  # piece lane + 32 i: key lane // 8 + 4 i, piece lane % 8 of the row
            u = np.int32(lane % K_PIECES)
            col = chunk * sub + values * u
            valid = live and col < D  # past D (a last, narrower chunk): zeros, never read
            col = imin(col, D - values)
            r = np.int32(lane // K_PIECES)
            at += r * (K_PIECES + 1) * words + u * words
            for _ in range(SPLIT // 4):
                src = lane_value(row, r)
                copy(k_cache, np.int64(src) * np.int64(d32) + col, ws, at, valid)
                r = np.int32(r + 4)
                at += 4 * (K_PIECES + 1) * words
        elif 32 % (D // values) == 0 and v_keys * (D // values) % 32 == 0:  # (D: a constant)
            # whole rows a pass, a fixed piece a lane: lane l takes piece l % units of key
            # l // units, + 32 / units keys a pass (the K item's way: no division, no checks)
            units = D // values
            r = np.int32(lane // units)
            col = values * (lane % units)
            at += lane * words
            for _ in range(v_keys * units // 32):
                src = lane_value(row, v_keys * (sub - k_items) + r)
                copy(v_cache, np.int64(src) * np.int64(d32) + col, ws, at, live)
                r = np.int32(r + 32 // units)
                at += 32 * words
        else:  # piece lane + 32 i: key e // units, piece e % units
            units = D // values
            key0 = v_keys * (sub - k_items)
            for i in range((v_keys * units + 31) // 32):
                e = lane + 32 * i
                r, u = e // units, e % units
                src = lane_value(row, key0 + imin(r, v_keys - 1))
                if r < v_keys:  # a last pass of a row not a multiple of 32 pieces: lanes idle
                    copy(
                        v_cache,
                        np.int64(src) * np.int64(d32) + values * u,
                        ws,
                        at + (r * units + u) * words,
                        live,
                    )

    @cuda.jit(device=True)
    def dot_chunk(fs, ws, cache, k_at, q_at, D, group, n, sc):
        """The n (<= K_PIECES) pieces of a K item's row at ws[k_at ..] against the queries
        from fs[q_at ..], in order; written out, since numba leaves a loop of them a loop
        with 64-bit counters and address math at every step."""
        w = kv_words4(cache) * (values // 4)
        dot(fs, ws, cache, k_at, q_at, D, group, sc)
        if n > 1:
            dot(fs, ws, cache, k_at + w, q_at + values, D, group, sc)
        if n > 2:
            dot(fs, ws, cache, k_at + 2 * w, q_at + 2 * values, D, group, sc)
        if n > 3:
            dot(fs, ws, cache, k_at + 3 * w, q_at + 3 * values, D, group, sc)
        if n > 4:
            dot(fs, ws, cache, k_at + 4 * w, q_at + 4 * values, D, group, sc)
        if n > 5:
            dot(fs, ws, cache, k_at + 5 * w, q_at + 5 * values, D, group, sc)
        if n > 6:
            dot(fs, ws, cache, k_at + 6 * w, q_at + 6 * values, D, group, sc)
        if n > 7:
            dot(fs, ws, cache, k_at + 7 * w, q_at + 7 * values, D, group, sc)

    @cuda.jit(device=True)
    def columns(fs, ws, cache, v_at, p_at, v_row, group, acc, ps):
        """acc[4 g + e] += p_g[j] * V[j, e] over a V item's v_keys keys j in order (this
        lane's four columns of its first row at ws[v_at ..], rows v_row words apart; p_g of
        its first key at fs[p_at + g SPLIT]), four keys at a time, written out (a loop of
        them stays a loop)."""
        _four_keys(fs, ws, cache, v_at, p_at, v_row, group, acc, ps)
        _four_keys(fs, ws, cache, v_at + 4 * v_row, p_at + 4, v_row, group, acc, ps)
        if v_keys > 8:
            _four_keys(fs, ws, cache, v_at + 8 * v_row, p_at + 8, v_row, group, acc, ps)
            _four_keys(fs, ws, cache, v_at + 12 * v_row, p_at + 12, v_row, group, acc, ps)

    @cuda.jit(device=True)
    def refill(k_cache, v_cache, ws, at, row, row_next, lane, D, item, items, live, live_next):
        """Ring item `item` of this split (rows `row`), or item - items of the next one, into
        the stage at ws[at ..]."""
        if item >= items:
            row, item, live = row_next, item - items, live_next
        copy_item(k_cache, v_cache, ws, at, row, lane, D, item, live)

    return copy_item, refill, dot_chunk, columns


@cuda.jit(device=True)
def _split_rows(block_tables, table_at, sp, n_keys, first, bs, shift, num_blocks, Hk, hk, lane):
    """(the cache row of key `lane` of split sp, 1 where that key's block-table entry is bad);
    lanes past the last key take its first key's row (finite values that p = 0 will weigh).
    first: ignored (_split_rows_masked's)."""
    lo = sp * SPLIT
    key = lo + (lane if lane < n_keys - lo else 0)
    row, bad = _key_row(block_tables, table_at, key, bs, shift, num_blocks, Hk, hk)
    return row, bad


@cuda.jit(device=True)
def _split_rows_masked(
    block_tables, table_at, sp, n_keys, first, bs, shift, num_blocks, Hk, hk, lane
):
    """_split_rows, with keys before the window's first key `first` read as that key
    (_attention_common.split_loader says why)."""
    lo = sp * SPLIT
    key = lo + (lane if lane < n_keys - lo else 0)
    if key < first:
        key = first
    row, bad = _key_row(block_tables, table_at, key, bs, shift, num_blocks, Hk, hk)
    return row, bad


def _kernel_for(
    rope: bool,
    masked: bool,
    group: int,
    head_dim: int,
    itemsize: int,
    warps: int,
    stages: int,
    registers: int,
):
    """The split kernel (module docstring) for GQA groups of `group` query heads of head_dim
    dims over a cache of itemsize-byte values, blocks of `warps` warps and rings of `stages`
    stages (constants of the kernel: its loops have fixed trip counts, one copy of the code
    each); with rope it reads q from qkv and does qkv_rope's work for its row first
    (rope_attention); masked: it takes the window and the cap (_attention_common), else
    ignores them."""
    threads = 32 * warps
    values, chunk, v_keys = _geometry(head_dim, itemsize)
    copy_item, refill, dot_chunk, columns = _piece_helpers(values)
    split_rows = _split_rows_masked if masked else _split_rows
    stages = _stages(head_dim, itemsize, stages)
    k_items = -(-head_dim // chunk)
    items = k_items + SPLIT // v_keys  # ring items a split
    wait_oldest = copy_async_waiter(stages - 1)  # the oldest of `stages` copy groups landed
    stage_words = _stage_words(head_dim, itemsize)  # shared_bytes' layout
    q_items = -(-group * max(head_dim, MAX_DIM) // threads)  # query values a thread loads
    q_len = max(Q_ITEMS, q_items)
    halves = -(-head_dim // 128)  # p @ V: a lane's four columns in each 128 (WIDE_DIM: two)

    @cuda.jit(cache=True, **({"max_registers": registers} if registers else {}))
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
        num_blocks, bs, Hk = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
        Hq = part_acc.shape[1]
        G, D = group, head_dim
        # The queries go in the same trip to memory as the row's metadata (they do not depend
        # on it); q is [T, Hq * D] (or qkv, whose first Hq * D columns are q), so this kv
        # head's G query heads are one run of G * D values, staged as they come.
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
            qv = cuda.local.array(q_len, float32)
            for i in range(q_items):
                e = tid + i * threads
                if e < G * D:
                    qv[i] = q[t, hk * G * D + e]
        s, n_keys = _row(query_start_loc, seq_lens, block_tables, t, bs)
        n_splits = (n_keys + SPLIT - 1) // SPLIT
        sp_first, key_first = 0, 0  # the window's first split and key (masked)
        if masked:
            key_first = window_start(n_keys, window)
            sp_first = key_first // SPLIT
        if s < 0 or z * warps >= n_splits - sp_first:
            return
        fs = cuda.shared.array(0, float32)  # dynamic: queries, probabilities, rings
        ws = cuda.shared.array(0, uint32)  # the same memory: the rings' raw cache words
        shift = block_shift(bs)
        step = nz * warps  # warp w of block z takes splits z warps + w, then + step, ..
        if rope:
            if query_start_loc[s + 1] - query_start_loc[s] != 1:  # not a one-token row
                if z == 0 and tid < G:  # a negative sum: the combine leaves the row unwritten
                    part_ml[t, hk * G + tid, sp_first, 1] = -1.0
                return
            # The block whose warps read the row's newest key makes that key and stores it
            # first: the barrier below orders the store before its warps' copies, which read
            # the cache through L2 (ld.global.nc reads, as the split kernel's, need not see it).
            writer = (n_splits - 1 - sp_first) % step // warps == z
            for g0 in range(0, G + 1, warps):  # block-uniform: every warp reduces alike
                g = g0 + w
                if g0 > 0:  # later rounds (G >= warps) load their heads now
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
                            fs[g * D + 32 * c + lane] = x[c] * scale
                elif g == G and writer and 0 <= slot < num_blocks * bs:  # not padding
                    blk, off = _slot_of_slot(slot, bs, shift)
                    for c in range(4):
                        if c < n:
                            kv_store(k_cache, blk, off, hk, 32 * c + lane, x[c])
                            kv_store(v_cache, blk, off, hk, 32 * c + lane, v[c])
        else:
            for i in range(q_items):
                e = tid + i * threads
                if e < G * D:
                    fs[e] = qv[i] * scale
        cuda.syncthreads()

        # From here each warp works alone through its ring (warp barriers only).
        first = sp_first + z * warps + w
        count = (n_splits - first + step - 1) // step if first < n_splits else 0
        trips = count
        if SIMULATOR:  # warp 0's count: every thread makes the same (block) barriers
            trips = (n_splits - sp_first - z * warps + step - 1) // step
        elif count == 0:
            return
        units = D // 4
        words4 = kv_words4(k_cache)
        k_row = (K_PIECES + 1) * words4 * (values // 4)  # words of a K item's row
        p_at = G * D + w * G * SPLIT
        ring = G * D + warps * G * SPLIT + w * stages * stage_words
        table_at = s * block_tables.shape[1]
        col = imin(lane, units - 1)  # p @ V: this lane's four columns (lanes past D repeat)
        col2 = imin(lane + 32, units - 1)  # and WIDE_DIM's second four
        sc = cuda.local.array(SUMS, float32)
        acc = cuda.local.array(SUMS, float32)
        acc2 = cuda.local.array(SUMS, float32)  # WIDE_DIM: columns 128 + 4l ..
        ps = cuda.local.array(SUMS, float32)
        ml = cuda.local.array(STATES, float32)
        rows = (block_tables, table_at)
        row, bad = np.int32(0), 0
        if count > 0:
            row, bad = split_rows(
                *rows, first, n_keys, key_first, bs, shift, num_blocks, Hk, hk, lane
            )
        for i in range(stages):  # the first split's first items in flight
            copy_item(k_cache, v_cache, ws, ring + i * stage_words, row, lane, D, i, count > 0)
            copy_async_commit()
        ring_end = ring + stages * stage_words
        at = ring  # the stage of the next item to read
        for c in range(trips):
            live = c < count
            sp = first + c * step
            n_here = imin(n_keys - sp * SPLIT, SPLIT)
            row_next, bad_next = np.int32(0), 0
            if c + 1 < count:  # read a split ahead: in hand when its first item is copied
                row_next, bad_next = split_rows(
                    *rows, sp + step, n_keys, key_first, bs, shift, num_blocks, Hk, hk, lane
                )
            for e in range(SUMS):
                sc[e] = np.float32(0.0)
            for k_item in range(k_items):  # q . k over each K item's dims, lane j key j
                sub = np.int32(k_item)  # (a name of its own: numba gives a name one type)
                wait_oldest()  # this lane's copies of the item have landed
                sync_warp()  # and every lane's
                n = K_PIECES if D % chunk == 0 else imin(chunk, D - chunk * sub) // values
                if live and lane < n_here:
                    dot_chunk(fs, ws, k_cache, at + lane * k_row, chunk * sub, D, G, n, sc)
                sync_warp()  # the stage read by every lane: the item `stages` on goes there
                refill(
                    k_cache,
                    v_cache,
                    ws,
                    at,
                    row,
                    row_next,
                    lane,
                    D,
                    sub + stages,
                    items,
                    live,
                    c + 1 < count,
                )
                copy_async_commit()  # (an empty group past the end keeps the count)
                at = _next_stage(at, ring, ring_end, stage_words)
            valid = live and lane < n_here
            if masked:
                valid = valid and sp * SPLIT + lane >= key_first
                _softmax_capped(sc, ml, fs, p_at, valid, lane, G, cap)
            else:
                _softmax(sc, ml, fs, p_at, valid, lane, G)
            split_bad = warp_max(np.float32(bad))  # any lane's key
            for e in range(SUMS):
                acc[e] = np.float32(0.0)
                if halves > 1:
                    acc2[e] = np.float32(0.0)
            for vi in range(SPLIT // v_keys):  # p @ V over each V item's keys, lane l
                item = np.int32(k_items + vi)  # columns 4l .. 4l + 3
                wait_oldest()
                sync_warp()  # (and p written by every lane)
                if live:
                    columns(
                        fs,
                        ws,
                        v_cache,
                        at + col * words4,
                        p_at + v_keys * vi,
                        units * words4,
                        G,
                        acc,
                        ps,
                    )
                    if halves > 1:
                        columns(
                            fs,
                            ws,
                            v_cache,
                            at + col2 * words4,
                            p_at + v_keys * vi,
                            units * words4,
                            G,
                            acc2,
                            ps,
                        )
                sync_warp()
                refill(
                    k_cache,
                    v_cache,
                    ws,
                    at,
                    row,
                    row_next,
                    lane,
                    D,
                    item + stages,
                    items,
                    live,
                    c + 1 < count,
                )
                copy_async_commit()
                at = _next_stage(at, ring, ring_end, stage_words)
            if live:
                for g in range(G):
                    h = hk * G + g
                    if lane < units:
                        store_f32x4(
                            part_acc,
                            (t, h, sp, 4 * lane),
                            acc[4 * g],
                            acc[4 * g + 1],
                            acc[4 * g + 2],
                            acc[4 * g + 3],
                        )
                    if halves > 1 and lane + 32 < units:
                        store_f32x4(
                            part_acc,
                            (t, h, sp, 4 * (lane + 32)),
                            acc2[4 * g],
                            acc2[4 * g + 1],
                            acc2[4 * g + 2],
                            acc2[4 * g + 3],
                        )
                    if lane == 0:  # a negative sum: the combine leaves the row unwritten
                        part_ml[t, h, sp, 0] = ml[2 * g]
                        part_ml[t, h, sp, 1] = ml[2 * g + 1] if split_bad == 0 else -1.0
            row, bad = row_next, bad_next

    return kernel


@functools.cache
def _kernel(
    rope: bool,
    group: int,
    head_dim: int,
    itemsize: int,
    geometry: tuple[int, int, int],
    masked: bool = False,
):
    return _kernel_for(rope, masked, group, head_dim, itemsize, *geometry)


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
    """The split kernel over blocks (row, kv head, z), then the combine."""
    T, Hq, D = out.shape
    Hk, bs = k_cache.shape[2], k_cache.shape[1]
    part_acc, part_ml = scratch[0][:T], scratch[1][:T]
    geometry = GEOMETRY[k_cache.dtype.type]
    warps, stages, _ = geometry
    # about TARGET_BLOCKS blocks, their warps looping over splits z warps + w, + nz warps, ..:
    # with a warp per split of the longest context, a batch of short rows launches mostly
    # empty blocks
    nz = min(-(-part_acc.shape[2] // warps), max(1, -(-TARGET_BLOCKS // (T * Hk))))
    masked = bool(window or softcap)
    kernel = _kernel(rope, Hq // Hk, D, k_cache.dtype.itemsize, geometry, masked)
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
    nbytes = shared_bytes(Hq // Hk, D, k_cache.dtype.itemsize, warps, stages)
    allow_dynamic_shared(kernel, args, nbytes)
    kernel[(T, Hk, nz), 32 * warps, stream, nbytes](*args)
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
    """As _attention_split.decode_attention (the same arguments and bits)."""
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
    """As _attention_split.rope_attention (the same arguments, checks and bits)."""
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
