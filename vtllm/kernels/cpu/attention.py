"""Paged KV cache writes and varlen causal attention over it. Hot path: keep it lean.

One task per (query token, query head); a query's work depends only on its own sequence's
cache and its position, never on how the batch was built, how the prompt was chunked or which
thread runs it. Per query, with its keys in position order 0..pos:
  pass 1: s_j = (q . k_j) * scale  (16 lanes + fixed tree, as in linear; 16 keys share one
          transposed tree, hsum16, which gives each key the bits of its own hsum); mx = max s_j
  pass 2: p_j = exp(s_j - mx) (vexp, 16 at a time); l = sum of p_j (16 lanes + fixed tree)
  pass 3: o = sum_j p_j * v_j accumulated in j order, then o / l
Two passes instead of an online softmax: no per-key rescaling of o, and one exp per key. The
order is fixed either way, which is what makes a decode step, a prefill chunk and a whole
prefill produce the same bits for the same query.
"""

import numpy as np
from numba import njit, prange
from numba.core import types

from vtllm.kernels import check_attention_shapes
from vtllm.kernels.cpu._simd import (
    carray,
    exp32,
    fma32,
    hmax,
    hsum,
    hsum16,
    vadd,
    vdiv,
    vexp,
    vfma,
    vload,
    vmax,
    vmul,
    vsplat,
    vstore,
    vsub,
    vzero,
)

_F, _I = types.float32, types.int32
# k, v, k_cache, v_cache, slot_mapping
_WRITE_SIG = types.int64(
    carray(_F, 3, True), carray(_F, 3, True), carray(_F, 4), carray(_F, 4), carray(_I, 1, True)
)
# q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out
_ATTN_SIG = types.int64(
    carray(_F, 3, True),
    carray(_F, 4, True),
    carray(_F, 4, True),
    carray(_I, 2, True),
    carray(_I, 1, True),
    carray(_I, 1, True),
    _F,
    carray(_F, 3),
)


@njit(_WRITE_SIG, nogil=True, cache=True)
def _write_kv_kernel(k, v, k_cache, v_cache, slot_mapping):
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    for t in range(k.shape[0]):  # validate every slot before writing anything
        if slot_mapping[t] < -1 or slot_mapping[t] >= num_blocks * block_size:
            return t
    for t in range(k.shape[0]):
        slot = slot_mapping[t]
        if slot >= 0:
            k_cache[slot // block_size, slot % block_size] = k[t]
            v_cache[slot // block_size, slot % block_size] = v[t]
    return -1


@njit(inline="always")
def _validate(T, block_tables, seq_lens, query_start_loc, num_blocks, block_size, seq_of):
    """Fills seq_of[t] (-1: row not covered); returns -1, a bad sequence, or S for bad loc."""
    S = seq_lens.shape[0]
    if query_start_loc[0] < 0 or query_start_loc[S] > T:
        return S
    for s in range(S):
        n = query_start_loc[s + 1] - query_start_loc[s]
        ctx = seq_lens[s]
        if n < 0 or ctx < n or (ctx + block_size - 1) // block_size > block_tables.shape[1]:
            return s
        for b in range((ctx + block_size - 1) // block_size):
            if block_tables[s, b] < 0 or block_tables[s, b] >= num_blocks:
                return s
        for t in range(query_start_loc[s], query_start_loc[s + 1]):
            seq_of[t] = s
    return -1


@njit(inline="always")
def _dot(a, ao, b, bo, D):
    d16 = D - D % 16
    acc = vzero()
    for c in range(0, d16, 16):
        acc = vfma(vload(a, ao + c), vload(b, bo + c), acc)
    y = hsum(acc)
    for c in range(d16, D):
        y = fma32(a[ao + c], b[bo + c], y)
    return y


@njit(inline="always")
def _accumulate(vf, of, oo, sc, table, n_ctx, block_size, Hk, kvh, D, c0, width):
    """of[oo+c0 : oo+c0+width] = sum_j sc[j] * v_j[c0 : c0+width], j in order; width 64 or 16,
    kept in registers across all keys."""
    a0 = a1 = a2 = a3 = vzero()
    j = 0
    for b in range((n_ctx + block_size - 1) // block_size):
        vo = ((table[b] * block_size) * Hk + kvh) * D + c0
        for _ in range(min(block_size, n_ctx - j)):
            p = vsplat(sc[j])
            a0 = vfma(p, vload(vf, vo), a0)
            if width == 64:
                a1 = vfma(p, vload(vf, vo + 16), a1)
                a2 = vfma(p, vload(vf, vo + 32), a2)
                a3 = vfma(p, vload(vf, vo + 48), a3)
            vo += Hk * D
            j += 1
    vstore(of, oo + c0, a0)
    if width == 64:
        vstore(of, oo + c0 + 16, a1)
        vstore(of, oo + c0 + 32, a2)
        vstore(of, oo + c0 + 48, a3)


@njit(inline="always")
def _scores16(qf, qo, kf, k0, row, d16):
    """Lane i = q . k_i over the 16-wide part of D, for the 16 keys at k0 + i * row; each lane
    bit-equal to _dot's hsum (hsum16)."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = vzero()
    a8 = a9 = a10 = a11 = a12 = a13 = a14 = a15 = vzero()
    for c in range(0, d16, 16):
        qv = vload(qf, qo + c)
        k = k0 + c
        a0, a1 = vfma(qv, vload(kf, k), a0), vfma(qv, vload(kf, k + row), a1)
        a2, a3 = vfma(qv, vload(kf, k + 2 * row), a2), vfma(qv, vload(kf, k + 3 * row), a3)
        a4, a5 = vfma(qv, vload(kf, k + 4 * row), a4), vfma(qv, vload(kf, k + 5 * row), a5)
        a6, a7 = vfma(qv, vload(kf, k + 6 * row), a6), vfma(qv, vload(kf, k + 7 * row), a7)
        a8, a9 = vfma(qv, vload(kf, k + 8 * row), a8), vfma(qv, vload(kf, k + 9 * row), a9)
        a10, a11 = vfma(qv, vload(kf, k + 10 * row), a10), vfma(qv, vload(kf, k + 11 * row), a11)
        a12, a13 = vfma(qv, vload(kf, k + 12 * row), a12), vfma(qv, vload(kf, k + 13 * row), a13)
        a14, a15 = vfma(qv, vload(kf, k + 14 * row), a14), vfma(qv, vload(kf, k + 15 * row), a15)
    return hsum16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15)


@njit(inline="always")
def _attend(qf, qo, kf, vf, of, oo, table, n_ctx, block_size, Hk, kvh, D, scale):
    """out row at oo = softmax over keys 0..n_ctx-1 of (q . k) * scale, times v."""
    d16 = D - D % 16
    row = Hk * D  # floats from one key (or value) row to the next within a block
    sc = np.empty(n_ctx, np.float32)
    done = 0
    vmx = vsplat(np.float32(-np.inf))
    if block_size % 16 == 0:  # groups of 16 keys never straddle a block
        vscale = vsplat(scale)
        done = n_ctx - n_ctx % 16
        for g in range(0, done, 16):
            k0 = (table[g // block_size] * block_size + g % block_size) * row + kvh * D
            vstore(sc, g, _scores16(qf, qo, kf, k0, row, d16))
            for i in range(16 if d16 < D else 0):  # D % 16 tail, as _dot does it
                y = sc[g + i]
                for c in range(d16, D):
                    y = fma32(qf[qo + c], kf[k0 + i * row + c], y)
                sc[g + i] = y
            s = vmul(vload(sc, g), vscale)
            vstore(sc, g, s)
            vmx = vmax(vmx, s)
    mx = hmax(vmx)
    for j in range(done, n_ctx):  # the rest one key at a time: the same bits
        ko = (table[j // block_size] * block_size + j % block_size) * row + kvh * D
        y = _dot(qf, qo, kf, ko, D) * scale
        sc[j] = y
        mx = max(mx, y)
    n16 = n_ctx - n_ctx % 16
    vmx = vsplat(mx)
    lanes = vzero()
    for j in range(0, n16, 16):
        p = vexp(vsub(vload(sc, j), vmx))
        vstore(sc, j, p)
        lanes = vadd(lanes, p)
    total = hsum(lanes)
    for j in range(n16, n_ctx):
        sc[j] = exp32(sc[j] - mx)
        total += sc[j]
    # o = sum_j p_j v_j, each column accumulated over j in order, 64 or 16 columns at a time
    for c0 in range(0, d16 - d16 % 64, 64):
        _accumulate(vf, of, oo, sc, table, n_ctx, block_size, Hk, kvh, D, c0, 64)
    for c0 in range(d16 - d16 % 64, d16, 16):
        _accumulate(vf, of, oo, sc, table, n_ctx, block_size, Hk, kvh, D, c0, 16)
    for c in range(d16, D):
        y = np.float32(0.0)
        for j in range(n_ctx):
            vo = ((table[j // block_size] * block_size + j % block_size) * Hk + kvh) * D
            y = fma32(sc[j], vf[vo + c], y)
        of[oo + c] = y
    vt = vsplat(total)
    for c in range(0, d16, 16):
        vstore(of, oo + c, vdiv(vload(of, oo + c), vt))
    for c in range(d16, D):
        of[oo + c] = of[oo + c] / total


@njit(_ATTN_SIG, nogil=True, parallel=True, cache=True)
def _paged_attention_kernel(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out
):
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
        # zig-zag the rows (0, T-1, 1, T-2, ...): causal rows grow in cost, and prange hands
        # each thread one contiguous range of tasks, which should hold short and long alike
        zig = task // Hq
        t = zig // 2 if zig % 2 == 0 else T - 1 - zig // 2
        s = seq_of[t]
        if s >= 0:
            # this query sits at position seq_lens[s] - n_s + i and sees keys 0..position
            n_ctx = seq_lens[s] - (query_start_loc[s + 1] - t) + 1
            h = task - zig * Hq
            kvh = h // group
            row = (t * Hq + h) * D  # the same row of q and of out
            table = block_tables[s]
            _attend(qf, row, kf, vf, of, row, table, n_ctx, block_size, Hk, kvh, D, scale)
    return -1


def _check(op, name, a, dtype, ndim):
    if not (isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == ndim):
        raise ValueError(
            f"{op}: {name} must be a {ndim}-D {np.dtype(dtype)} array, got "
            f"{getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')}"
        )
    if not a.flags.c_contiguous:
        raise ValueError(f"{op}: {name} must be C-contiguous")


def write_kv(
    k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slot_mapping: np.ndarray
) -> None:
    """k_cache/v_cache [num_blocks, block_size, Hk, D] at slot_mapping[t] (= block * block_size
    + offset; -1 skips the row) <- k[t], v[t] ([T, Hk, D])."""
    for name, a in (("k", k), ("v", v)):
        _check("write_kv", name, a, np.float32, 3)
    for name, a in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check("write_kv", name, a, np.float32, 4)
    _check("write_kv", "slot_mapping", slot_mapping, np.int32, 1)
    if (
        v.shape != k.shape
        or v_cache.shape != k_cache.shape
        or k.shape[1:] != k_cache.shape[2:]
        or slot_mapping.shape != k.shape[:1]
    ):
        raise ValueError(
            f"write_kv: shapes do not match: k {k.shape}, v {v.shape}, k_cache "
            f"{k_cache.shape}, v_cache {v_cache.shape}, slots {slot_mapping.shape}"
        )
    bad = _write_kv_kernel(k, v, k_cache, v_cache, slot_mapping)
    if bad >= 0:
        raise ValueError(f"write_kv: slot {slot_mapping[bad]} at row {bad} is outside the cache")


def paged_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    query_start_loc: np.ndarray,
    scale: float,
    out: np.ndarray,
) -> None:
    """Causal attention of q [T, Hq, D] over the paged cache; out [T, Hq, D].

    Sequence s owns rows query_start_loc[s]:query_start_loc[s+1] of q; its query i sits at
    position seq_lens[s] - n_s + i (seq_lens counts the new tokens, already in the cache) and
    attends to positions 0..itself through block_tables[s]. Query head h reads kv head
    h // (Hq // Hk). Rows of q outside every sequence are left unwritten in out.
    """
    _check("paged_attention", "q", q, np.float32, 3)
    _check("paged_attention", "out", out, np.float32, 3)
    for name, a in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check("paged_attention", name, a, np.float32, 4)
    _check("paged_attention", "block_tables", block_tables, np.int32, 2)
    _check("paged_attention", "seq_lens", seq_lens, np.int32, 1)
    _check("paged_attention", "query_start_loc", query_start_loc, np.int32, 1)
    check_attention_shapes(
        "paged_attention", q, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc
    )
    t, s = q.shape[0], seq_lens.shape[0]
    if s == 0:
        return
    bad = _paged_attention_kernel(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, out
    )
    if bad == s:
        raise ValueError(f"paged_attention: query_start_loc {query_start_loc} does not fit T={t}")
    if bad >= 0:
        raise ValueError(
            f"paged_attention: sequence {bad} is inconsistent: seq_len "
            f"{seq_lens[bad]}, queries {query_start_loc[bad]}.."
            f"{query_start_loc[bad + 1]}, blocks {block_tables[bad]}"
        )
