"""Paged KV cache writes and varlen causal attention over it on the GPU. Hot path: keep it lean.

Same metadata as the CPU kernels (block_tables, seq_lens, query_start_loc). paged_attention
runs one block per (query token, query head), with threads = D rounded up to a warp: keys are
taken in tiles of that many, one key per thread for q . k, then an online softmax (running max
and sum, rescaled per tile) and thread d accumulates column d of p @ V. Decode and prefill
share it; GQA maps query head h to kv head h // (Hq // Hk).

The general kernel, for correctness on any shape: q . k reads each key row within one
thread, and kv heads shared by several query heads are re-read from L2. The fast paths for
the shapes they support are attention_split / attention_ring (flash-decoding over key splits)
and, where asked, attention_flash (tensor cores); see paged_attention.

Metadata lives on the device, so launchers check only dtypes and shapes; the kernels skip
what is out of range instead of raising: slot -1 (padding) in write_kv, rows of q outside every
sequence, and sequences whose lengths or block-table entries do not fit (left unwritten).
"""

import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels import check_attention_shapes
from vtllm.kernels.cuda._device import (
    MAX_WARPS,
    NEG_INF,
    SIMULATOR,
    block_max,
    block_sum,
    fmax,
    imin,
)
from vtllm.kernels.cuda._host import check
from vtllm.kernels.cuda._kv_cache import check_kv, kv_store, kv_value
from vtllm.kernels.cuda._ptx import grid_dependency_sync

WRITE_THREADS = 32 if SIMULATOR else 128
MAX_THREADS = 512  # so head_dim <= 512 (over 64 registers a thread: 1024 would not fit an SM)


@cuda.jit(cache=True)
def _write_kv_kernel(k, v, k_cache, v_cache, slot_mapping):
    grid_dependency_sync()
    t = cuda.blockIdx.x
    slot = slot_mapping[t]
    bs = k_cache.shape[1]
    if slot < 0 or slot >= k_cache.shape[0] * bs:
        return
    blk, off = slot // bs, slot % bs
    hk, d = k.shape[1], k.shape[2]
    for j in range(cuda.threadIdx.x, hk * d, cuda.blockDim.x):
        h, c = j // d, j % d
        kv_store(k_cache, blk, off, h, c, k[t, h, c])
        kv_store(v_cache, blk, off, h, c, v[t, h, c])


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


@cuda.jit(cache=True)
def _paged_attention_kernel(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out
):
    grid_dependency_sync()
    t, h = cuda.blockIdx.x, cuda.blockIdx.y
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    D = q.shape[2]
    num_blocks, bs, Hk = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    s = _sequence_of(query_start_loc, t)
    if s < 0:
        return
    n_q = query_start_loc[s + 1] - query_start_loc[s]
    ctx = seq_lens[s]
    if ctx < n_q or (ctx + bs - 1) // bs > block_tables.shape[1]:
        return
    n_ctx = ctx - (query_start_loc[s + 1] - t) + 1  # this query sees keys 0..its position
    ok = 1
    for b in range(tid, (n_ctx + bs - 1) // bs, nt):
        e = block_tables[s, b]
        if e < 0 or e >= num_blocks:
            ok = 0
    if cuda.syncthreads_and(ok) == 0:
        return
    kvh = h // (q.shape[1] // Hk)
    red = cuda.shared.array(MAX_WARPS, float32)
    sq = cuda.shared.array(MAX_THREADS, float32)  # q row
    sp = cuda.shared.array(MAX_THREADS, float32)  # the tile's probabilities
    if tid < D:
        sq[tid] = q[t, h, tid]
    cuda.syncthreads()
    m = NEG_INF  # running max of the scores
    den = np.float32(0.0)  # running sum of exp(score - m)
    acc = np.float32(0.0)  # running (p @ V)[tid]
    for j0 in range(0, n_ctx, nt):
        j = j0 + tid
        score = NEG_INF
        if j < n_ctx:
            blk = block_tables[s, j // bs]
            off = j % bs
            d0 = d1 = d2 = d3 = np.float32(0.0)  # 4 loads in flight
            c = 0
            while c + 3 < D:
                d0 += sq[c] * kv_value(k_cache, blk, off, kvh, c)
                d1 += sq[c + 1] * kv_value(k_cache, blk, off, kvh, c + 1)
                d2 += sq[c + 2] * kv_value(k_cache, blk, off, kvh, c + 2)
                d3 += sq[c + 3] * kv_value(k_cache, blk, off, kvh, c + 3)
                c += 4
            while c < D:
                d0 += sq[c] * kv_value(k_cache, blk, off, kvh, c)
                c += 1
            score = ((d0 + d1) + (d2 + d3)) * scale
        m_new = fmax(m, block_max(score, red))  # finite: the tile holds at least one key
        p = math.exp(score - m_new) if j < n_ctx else np.float32(0.0)
        alpha = math.exp(m - m_new)  # 0 on the first tile
        sp[tid] = p
        den = den * alpha + block_sum(p, red)  # its barriers also publish sp
        if tid < D:
            a = acc * alpha
            cnt = imin(nt, n_ctx - j0)
            i = 0
            while i + 3 < cnt:  # 4 independent table + value loads in flight
                j = j0 + i
                v0 = kv_value(v_cache, block_tables[s, j // bs], j % bs, kvh, tid)
                v1 = kv_value(v_cache, block_tables[s, (j + 1) // bs], (j + 1) % bs, kvh, tid)
                v2 = kv_value(v_cache, block_tables[s, (j + 2) // bs], (j + 2) % bs, kvh, tid)
                v3 = kv_value(v_cache, block_tables[s, (j + 3) // bs], (j + 3) % bs, kvh, tid)
                a += sp[i] * v0 + sp[i + 1] * v1 + sp[i + 2] * v2 + sp[i + 3] * v3
                i += 4
            while i < cnt:
                j = j0 + i
                a += sp[i] * kv_value(v_cache, block_tables[s, j // bs], j % bs, kvh, tid)
                i += 1
            acc = a
        m = m_new  # the next tile writes sp only after block_max's barriers
    if tid < D:
        out[t, h, tid] = acc / den


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


def write_kv(k, v, k_cache, v_cache, slot_mapping, *, stream=0) -> None:
    """k_cache/v_cache [num_blocks, block_size, Hk, D] at slot_mapping[t] (= block * block_size
    + offset; -1 skips the row, as does any slot outside the cache) <- k[t], v[t] ([T, Hk, D]).
    The caches are float32 or bf16 bits (uint16; values rounded to nearest even)."""
    check("write_kv", "k", k, np.float32, 3)
    check("write_kv", "v", v, np.float32, 3, k.shape)
    check_kv("write_kv", k_cache, v_cache)
    check("write_kv", "slot_mapping", slot_mapping, np.int32, 1, k.shape[:1])
    if tuple(k.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(f"write_kv: k {k.shape} does not fit k_cache {k_cache.shape}")
    if k.shape[0] == 0:
        return
    _write_kv_kernel[k.shape[0], WRITE_THREADS, stream](k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    out,
    *,
    scratch=None,
    split=True,
    flash=False,
    stream=0,
) -> None:
    """Causal attention of q [T, Hq, D] over the paged cache (float32, or bf16 bits as uint16:
    _kv_cache); out [T, Hq, D]. Device arrays.

    Sequence s owns rows query_start_loc[s]:query_start_loc[s+1] of q; its query i sits at
    position seq_lens[s] - n_s + i (seq_lens counts the new tokens, already in the cache) and
    attends to positions 0..itself through block_tables[s]. Query head h reads kv head
    h // (Hq // Hk). Rows of q outside every sequence are left unwritten in out.

    Where head_dim <= 128 and a multiple of 4, and Hq / Hk <= 8 (unless split=False), the
    kernels of attention_split run it; `scratch` (attention_split.make_scratch) lets
    decode-sized batches spread each row over many blocks, with attention_ring's kernel from
    attention_ring.MIN_ROWS rows on (longer steps: its first rows, the prefill kernel the
    rest). Either way a row's result is the same bits, unless flash is set: then the rows
    that would go to the prefill kernel go to attention_flash's where it `supports` the cache
    and shape (tensor cores; other bits, see there).
    """
    check_attention(
        "paged_attention", q, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc
    )
    t, hq, d = q.shape
    s = seq_lens.shape[0]
    if s == 0 or t == 0:
        return
    from vtllm.kernels.cuda import attention_ring, attention_split

    if split and attention_split.supports(hq, k_cache.shape[2], d):
        meta = (block_tables, seq_lens, query_start_loc)
        kernels = attention_ring if t >= attention_ring.MIN_ROWS else attention_split
        kernels.split_attention(
            q, k_cache, v_cache, *meta, scale, out, scratch, flash=flash, stream=stream
        )
        return
    threads = max(32, -(-d // 32) * 32)
    _paged_attention_kernel[(t, hq), threads, stream](
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, np.float32(scale), out
    )
