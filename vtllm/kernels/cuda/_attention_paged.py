"""Varlen causal attention over the paged KV cache for any shape: the general kernel, which
attention.paged_attention runs where the split kernels do not take the shape. Hot path: keep it
lean.

One block per (query token, query head), with threads = D rounded up to a warp: keys are taken
in tiles of that many, one key per thread for q . k, then an online softmax (running max and
sum, rescaled per tile) and thread d accumulates column d of p @ V. GQA maps query head h to kv
head h // (Hq // Hk). For correctness on any shape: q . k reads each key row within one thread,
and kv heads shared by several query heads are re-read from L2.

It takes windows and caps as the exact family does (for the shapes only it serves, and with
split=False): a query at position p sees keys max(0, p - window + 1) .. p (window 0: all), and
a cap > 0 turns each score s into cap * tanh(s / cap) before the softmax. Tiles start at the
window's first key, so a row's bits depend on its own sequence and position only (not the
family's bits: other sums).
"""

import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._attention_common import MAX_THREADS, _sequence_of
from vtllm.kernels.cuda._device import MAX_WARPS, NEG_INF, block_max, block_sum, fmax, imin
from vtllm.kernels.cuda._kv_cache import kv_value
from vtllm.kernels.cuda._ptx import grid_dependency_sync


@cuda.jit(cache=True)
def _paged_attention_kernel(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, cap, out
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
    first = n_ctx - window if window > 0 and n_ctx > window else 0  # its window's first key
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
    for j0 in range(first, n_ctx, nt):
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
            if cap > 0:
                score = np.float32(math.tanh(score / cap)) * cap
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


def general_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    out,
    *,
    window=0,
    softcap=0.0,
    stream=0,
) -> None:
    """As attention.paged_attention, which checked the arguments."""
    t, hq, d = q.shape
    threads = max(32, -(-d // 32) * 32)
    _paged_attention_kernel[(t, hq), threads, stream](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        np.float32(scale),
        np.int32(window),
        np.float32(softcap),
        out,
    )
