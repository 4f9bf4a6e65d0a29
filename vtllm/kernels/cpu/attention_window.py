"""Causal attention over the paged KV cache with a sliding window and tanh soft-capping of
the scores (Gemma's local layers; Gemma 2's every layer). Hot path: keep it lean.

One task per (query token, query head), as in attention.py; a query at position p sees the
keys at max(0, p - window + 1) .. p (all of 0 .. p for window 0), in position order:
  pass 1: s_j = (q . k_j) * scale (attention._dot's lanes and tree), then, with a cap,
          s_j <- cap * tanh(s_j / cap); mx = max s_j
  pass 2: p_j = exp(s_j - mx) (exp32); l = sum of p_j in j order
  pass 3: o = sum_j p_j * v_j accumulated in j order, then o / l
Every step depends only on the query's own sequence and position, so a decode step, a prefill
chunk and a whole prefill give the same bits.
"""

import numpy as np
from numba import njit, prange
from numba.core import types

from vtllm.kernels import check_attention_shapes
from vtllm.kernels.cpu._simd import carray, exp32, fma32
from vtllm.kernels.cpu.attention import _check, _dot, _validate

_F, _I = types.float32, types.int32
# q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, cap, out
_SIG = types.int64(
    carray(_F, 3, True),
    carray(_F, 4, True),
    carray(_F, 4, True),
    carray(_I, 2, True),
    carray(_I, 1, True),
    carray(_I, 1, True),
    _F,
    types.int64,
    _F,
    carray(_F, 3),
)


@njit(inline="always")
def _attend(qf, qo, kf, vf, of, oo, table, j0, n_ctx, block_size, Hk, kvh, D, scale, cap):
    row = Hk * D  # floats from one key (or value) row to the next within a block
    sc = np.empty(n_ctx - j0, np.float32)
    mx = np.float32(-np.inf)
    for j in range(j0, n_ctx):
        ko = (table[j // block_size] * block_size + j % block_size) * row + kvh * D
        y = _dot(qf, qo, kf, ko, D) * scale
        if cap > 0:
            y = np.tanh(y / cap) * cap
        sc[j - j0] = y
        mx = max(mx, y)
    total = np.float32(0.0)
    for i in range(n_ctx - j0):
        sc[i] = exp32(sc[i] - mx)
        total += sc[i]
    for c in range(D):
        of[oo + c] = np.float32(0.0)
    for j in range(j0, n_ctx):
        p = sc[j - j0]
        vo = (table[j // block_size] * block_size + j % block_size) * row + kvh * D
        for c in range(D):
            of[oo + c] = fma32(p, vf[vo + c], of[oo + c])
    for c in range(D):
        of[oo + c] = of[oo + c] / total


@njit(_SIG, nogil=True, parallel=True, cache=True)
def _kernel(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, cap, out):
    T, Hq, D = q.shape
    num_blocks, block_size, Hk = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    seq_of = np.full(T, -1, np.int32)
    bad = _validate(T, block_tables, seq_lens, query_start_loc, num_blocks, block_size, seq_of)
    if bad >= 0:
        return bad
    qf = q.reshape(q.size)
    kf = k_cache.reshape(k_cache.size)
    vf = v_cache.reshape(v_cache.size)
    of = out.reshape(out.size)
    group = Hq // Hk
    for task in prange(T * Hq):
        zig = task // Hq  # zig-zag rows, as in attention.py: causal rows grow in cost
        t = zig // 2 if zig % 2 == 0 else T - 1 - zig // 2
        s = seq_of[t]
        if s >= 0:
            n_ctx = seq_lens[s] - (query_start_loc[s + 1] - t) + 1
            j0 = max(0, n_ctx - window) if window > 0 else 0
            h = task - zig * Hq
            r = (t * Hq + h) * D
            table = block_tables[s]
            _attend(
                qf, r, kf, vf, of, r, table, j0, n_ctx, block_size, Hk, h // group, D, scale, cap
            )
    return -1


def paged_attention_window(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    query_start_loc: np.ndarray,
    scale: float,
    window: int,
    softcap: float,
    out: np.ndarray,
) -> None:
    """attention.paged_attention with each query seeing only its last `window` positions
    (itself included; 0: all) and, with softcap > 0, scores capped to cap * tanh(s / cap)."""
    op = "paged_attention_window"
    _check(op, "q", q, np.float32, 3)
    _check(op, "out", out, np.float32, 3)
    for name, a in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check(op, name, a, np.float32, 4)
    _check(op, "block_tables", block_tables, np.int32, 2)
    _check(op, "seq_lens", seq_lens, np.int32, 1)
    _check(op, "query_start_loc", query_start_loc, np.int32, 1)
    check_attention_shapes(op, q, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc)
    if window < 0 or softcap < 0:
        raise ValueError(f"{op}: window {window} and softcap {softcap} must be >= 0")
    t, s = q.shape[0], seq_lens.shape[0]
    if s == 0:
        return
    bad = _kernel(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, softcap, out
    )
    if bad == s:
        raise ValueError(f"{op}: query_start_loc {query_start_loc} does not fit T={t}")
    if bad >= 0:
        raise ValueError(
            f"{op}: sequence {bad} is inconsistent: seq_len {seq_lens[bad]}, queries "
            f"{query_start_loc[bad]}..{query_start_loc[bad + 1]}, blocks {block_tables[bad]}"
        )
