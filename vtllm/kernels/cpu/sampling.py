"""Token sampler on the CPU. Hot path: keep it lean, put features in helpers.

Per row, in vLLM's order: logit bias; min_tokens masks (stop ids -> -inf while the output is
shorter); repetition penalty over prompt+output, frequency/presence over output (both read from
the mirror); then greedy (temperature < 1e-5), or float64 softmax of logits / T, min_p, top_k,
top_p on the renormalized rest, and an inverse-CDF draw. With a filter active the draw walks
tokens by descending probability (ties: lower id); with none it walks ids in vocabulary order.

Batch invariance is the law: a row's token depends only on its logits, its slot's table
entries, its mirror history and its position. Each row runs start to finish in one thread with a
fixed operation order (no fastmath, sums in 8 fixed lanes), and its uniform is a hash of
(seed, position), so batch makeup, batch order and thread count cannot change a bit.
"""

import numba as nb
import numpy as np
from numba import prange, types

from vtllm.kernels.cpu.logprobs import (
    F32,
    F32_1D,
    F32_2D,
    I32,
    I32_1D,
    I32_2D,
    LOGITS,
    check_array,
    exp_sum,
    parallel_kernel,
    prompt_logprobs,
    raw_logprobs,
    row_max,
)
from vtllm.kernels.sampling_table import (
    GREEDY_EPS,
    MAX_TOP_LOGPROBS,
    TABLE_LAYOUT,
    LogprobsOut,
    SamplingTable,
)

__all__ = ["LogprobsOut", "SamplingTable", "prompt_logprobs", "sample"]

_NUM_BINS = 64 * 64 + 1  # 1/64-octave bins of e = p / p_max down to 2^-64, then one tail bin
_ONE_BITS = np.int64(0x3FF0000000000000)  # float64 bits of 1.0
_MANT_SHIFT = np.int64(46)  # keep 6 of 52 mantissa bits
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


_jit = nb.njit(nogil=True, cache=True)
_jit_inline = nb.njit(nogil=True, cache=True, inline="always")  # tiny helpers inside hot loops


@_jit_inline
def _mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@_jit_inline
def _uniform(seed, position):
    """u in [0, 1) from (seed, position) alone: splitmix64 finalizer, twice."""
    z = _mix64(seed + _mix64(np.uint64(position) + _GOLDEN))
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@_jit
def _argmax(w):
    """First index of the maximum (ties go to the lowest id), twice as fast as np.argmax."""
    m = row_max(w)
    for i in range(w.size):
        if w[i] == m:
            return i
    return 0


@_jit
def _adjust(w, slot, position, table, token_ids):
    """Bias, then min_tokens stop masks, then penalties from the mirror history (vLLM's order).
    table is SamplingTable.arrays(): indices follow TABLE_LAYOUT."""
    V, prompt_len = w.size, table[10][slot]
    for j in range(table[13][slot]):
        t = table[11][slot, j]
        if 0 <= t < V:
            w[t] += np.float64(table[12][slot, j])
    out_start = min(max(prompt_len, 0), position)
    if position - out_start < table[8][slot]:
        for j in range(table[15][slot]):
            t = table[14][slot, j]
            if 0 <= t < V:
                w[t] = -np.inf
    r, f, p = np.float64(table[7][slot]), np.float64(table[6][slot]), np.float64(table[5][slot])
    if r == 1.0 and f == 0.0 and p == 0.0:
        return
    hist = token_ids[slot, :position]
    seen = np.int32(1 << 30)  # flag bit: repetition penalty already applied to this token
    counts = np.zeros(V, np.int32)
    for t in hist[out_start:]:
        if 0 <= t < V:
            counts[t] += 1
    if r != 1.0:  # each distinct prompt or output token once; HF/vLLM: divide if > 0
        for t in hist:
            if 0 <= t < V and counts[t] & seen == 0:
                counts[t] |= seen
                w[t] = w[t] / r if w[t] > 0.0 else w[t] * r
    if f != 0.0 or p != 0.0:  # output tokens only; zeroing the count applies each token once
        for t in hist[out_start:]:
            if 0 <= t < V and counts[t] & ~seen > 0:
                w[t] = w[t] - f * np.float64(counts[t] & ~seen) - p
                counts[t] &= seen


@_jit_inline
def _after(e, a, b):
    """Sampling order: descending e, ties by lower id. A total order, so any sort is stable."""
    return e[a] < e[b] or (e[a] == e[b] and a > b)


@_jit_inline
def _sift(e, ids, root, end):
    """Heap sift-down; the heap's top is the id that comes last in sampling order."""
    while 2 * root + 1 < end:
        c = 2 * root + 1
        if c + 1 < end and _after(e, ids[c + 1], ids[c]):
            c += 1
        if not _after(e, ids[c], ids[root]):
            return
        ids[c], ids[root], root = ids[root], ids[c], c


@_jit
def _sorted_bin(e, bins, b, n):
    """The n ids of bin b in sampling order. A heapsort: numba's argsort costs seconds of
    compile time, and bins are small (1/64 octave of probability)."""
    ids, j, lo, hi = np.empty(n, np.int64), 0, np.inf, -np.inf
    for i in range(bins.size):
        if bins[i] == b:
            ids[j], j, lo, hi = i, j + 1, min(lo, e[i]), max(hi, e[i])
    if lo == hi:  # exact ties (e.g. padded vocabulary rows) are already in id order
        return ids
    for root in range(n // 2 - 1, -1, -1):
        _sift(e, ids, root, n)
    for end in range(n - 1, 0, -1):
        ids[0], ids[end] = ids[end], ids[0]
        _sift(e, ids, 0, end)
    return ids


@_jit
def _walk(e, bins, cnt, mass, last_bin, last_r, target, strict):
    """Walk kept tokens in sampling order until the running mass reaches target (> if strict,
    >= if not); only the bin holding the crossing is sorted. The last kept token is the
    fallback for rounding. Returns (bin, tokens taken in it, mass through, token)."""
    acc = 0.0
    for b in range(last_bin + 1):
        if cnt[b] == 0:
            continue
        nxt = acc + mass[b]
        if b < last_bin and (nxt <= target if strict else nxt < target):
            acc = nxt
            continue
        ids = _sorted_bin(e, bins, b, cnt[b])
        n = cnt[b] if b < last_bin else last_r
        for j in range(n):
            acc += e[ids[j]]
            if (acc > target if strict else acc >= target) or (b == last_bin and j == n - 1):
                return b, j + 1, acc, ids[j]
    return -1, 0, acc, 0  # unreachable: last_bin is non-empty


@_jit
def _draw_filtered(e, top_k, top_p, u):
    """min_p already zeroed e; then top_k, top_p on the renormalized rest, draw (vLLM's order).
    Tokens are binned by the bits of e (1/64 octave) so only boundary bins are ever sorted."""
    ebits = e.view(np.int64)
    bins = np.full(e.size, -1, np.int32)
    cnt, mass = np.zeros(_NUM_BINS, np.int32), np.zeros(_NUM_BINS)
    for i in range(e.size):
        if e[i] > 0.0:
            b = min((_ONE_BITS - ebits[i]) >> _MANT_SHIFT, _NUM_BINS - 1)
            bins[i] = b
            cnt[b] += 1
            mass[b] += e[i]
    last_bin, num_pos = 0, 0
    for b in range(_NUM_BINS):
        if cnt[b] > 0:
            last_bin, num_pos = b, num_pos + cnt[b]
    last_r = cnt[last_bin]
    kept = mass[: last_bin + 1].sum()
    if 0 < top_k < num_pos:
        c = 0
        for b in range(_NUM_BINS):
            if c + cnt[b] >= top_k:
                last_bin, last_r = b, top_k - c
                break
            c += cnt[b]
        kept = _walk(e, bins, cnt, mass, last_bin, last_r, np.inf, False)[2]
    if top_p < 1.0:
        last_bin, last_r, kept, _ = _walk(e, bins, cnt, mass, last_bin, last_r, top_p * kept, False)
    return _walk(e, bins, cnt, mass, last_bin, last_r, u * kept, True)[3]


@_jit
def _choose(x, s, pos, table, token_ids, e):
    """The token of one row; e is float64 [V] scratch (holds probabilities after a draw)."""
    V = x.size
    w = x.astype(np.float64)  # private copy: the caller's logits stay untouched
    _adjust(w, s, pos, table, token_ids)
    t = np.float64(table[0][s])
    if t < GREEDY_EPS:
        return _argmax(w)
    m = row_max(w)
    if m == -np.inf:
        return 0
    k, p, mp = table[1][s], np.float64(table[2][s]), np.float64(table[3][s])
    z = exp_sum(w, m, 1.0 / t, e)
    u = _uniform(table[4][s], pos)
    if mp > 0.0 or 0 < k < V or p < 1.0:
        if mp > 0.0:  # e is p / p_max, so min_p compares against e directly
            for i in range(V):
                e[i] = e[i] if e[i] >= mp else 0.0
        return _draw_filtered(e, k, p, u)
    target, acc, tok = u * z, 0.0, 0  # no filter: inverse CDF in id order over the vocabulary
    for i in range(V):
        acc += e[i]
        if e[i] > 0.0:
            tok = i
            if acc > target:
                break
    return tok


_NB = {np.float32: types.float32, np.int32: types.int32, np.uint64: types.uint64}
_TABLE_T = types.Tuple(
    [types.Array(_NB[dtype], 2 if width else 1, "C") for dtype, width in TABLE_LAYOUT.values()]
)
_LP_T = types.Tuple([F32_1D, I32_1D, I32_2D, F32_2D])


@parallel_kernel(
    types.int64(LOGITS, I32_1D, I32_1D, _TABLE_T, I32_2D, I32_1D, I32_1D, types.boolean, _LP_T)
)
def _sample_kernel(logits, slots, positions, table, token_ids, num_tokens, out_tokens, want_lp, lp):
    """Returns -1, or the first row whose slot or position is out of range (nothing written)."""
    for b in range(slots.size):
        s, pos = slots[b], positions[b]
        if s >= token_ids.shape[0] or (s >= 0 and not 0 <= pos < token_ids.shape[1]):
            return b
    num_logprobs = table[9]
    for b in prange(slots.size):
        s, pos = slots[b], positions[b]
        tok = -1  # padding rows (slot < 0) only get -1
        if s >= 0:
            e = np.empty(logits.shape[1])
            tok = _choose(logits[b], s, pos, table, token_ids, e)
            token_ids[s, pos] = tok
            num_tokens[s] = pos + 1
            if want_lp and num_logprobs[s] >= 0:
                n = min(num_logprobs[s], lp[2].shape[1])
                lp[0][b], lp[1][b] = raw_logprobs(logits[b], tok, n, e, lp[2][b], lp[3][b])
        out_tokens[b] = tok
    return -1


_TABLE_CHECKS = [(f"table.{n}", np.dtype(d), w) for n, (d, w) in TABLE_LAYOUT.items()]
_LP_CHECKS = [
    (f"out_logprobs.{n}", d, k)
    for n, d, k in zip(LogprobsOut._fields, (F32, I32, I32, F32), (1, 1, 2, 2), strict=True)
]
_NO_LOGPROBS = tuple(LogprobsOut.create(0))


def sample(
    logits,
    slots,
    positions,
    table: SamplingTable,
    token_ids,
    num_tokens,
    out_tokens,
    *,
    out_logprobs: LogprobsOut | None = None,
) -> None:
    """Sample one token per row into out_tokens and the mirror: token_ids[slot, position] and
    num_tokens[slot] = position + 1. Rows with slot -1 are padding (token -1, nothing written).

    logits [B, V] float32 (read only); slots, positions, out_tokens [B] int32; token_ids
    [max_slots, max_len] int32; num_tokens [max_slots] int32. A slot may appear once per call.
    """
    check_array("logits", logits, F32, 2)
    B = logits.shape[0]
    check_array("slots", slots, I32, 1, (B,))
    check_array("positions", positions, I32, 1, (B,))
    check_array("out_tokens", out_tokens, I32, 1, (B,))
    check_array("token_ids", token_ids, I32, 2)
    S = token_ids.shape[0]
    check_array("num_tokens", num_tokens, I32, 1, (S,))
    arrays = table.arrays()
    for a, (name, dtype, width) in zip(arrays, _TABLE_CHECKS, strict=True):
        check_array(name, a, dtype, 2 if width else 1, (S, width) if width else (S,))
    lp, want = _NO_LOGPROBS, out_logprobs is not None
    if want:
        lp = tuple(out_logprobs)
        for a, (name, dtype, ndim) in zip(lp, _LP_CHECKS, strict=True):
            check_array(name, a, dtype, ndim, (B, MAX_TOP_LOGPROBS)[:ndim])
    bad = _sample_kernel(
        logits, slots, positions, arrays, token_ids, num_tokens, out_tokens, want, lp
    )
    if bad >= 0:
        raise ValueError(f"row {bad}: slot {slots[bad]} / position {positions[bad]} out of range")
