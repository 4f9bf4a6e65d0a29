"""numpy float64 reference of the token sampler (kernels/cpu/sampling.py), written for clarity:
a full sort instead of bins, Python ints for the counter-based uniform. Same semantics, so tests
compare token ids exactly on logits whose decision boundaries sit far from float noise."""

import numpy as np

from vtllm.kernels.sampling_table import EXP_CUTOFF, GREEDY_EPS

_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def uniform(seed: int, position: int) -> float:
    """u in [0, 1): splitmix64 finalizer of (seed + mix(position + golden))."""
    z = _mix64((seed + _mix64((position + 0x9E3779B97F4A7C15) & _M64)) & _M64)
    return (z >> 11) * 2.0**-53


def adjusted_logits(x, slot, position, table, token_ids) -> np.ndarray:
    """Logit bias, min_tokens stop masks, then penalties over the mirror history."""
    w = x.astype(np.float64)
    V = w.size
    for j in range(table.num_bias[slot]):
        w[table.bias_ids[slot, j]] += np.float64(table.bias_values[slot, j])
    out_start = min(max(int(table.prompt_len[slot]), 0), position)
    if position - out_start < table.min_tokens[slot]:
        w[table.min_stop_ids[slot, : table.num_min_stop_ids[slot]]] = -np.inf
    hist = token_ids[slot, :position]
    counts = np.bincount(hist[out_start:], minlength=V)[:V]
    rep = np.float64(table.repetition_penalty[slot])
    if rep != 1.0:
        seen = np.unique(hist)
        w[seen] = np.where(w[seen] > 0.0, w[seen] / rep, w[seen] * rep)
    ids = np.nonzero(counts)[0]
    if table.frequency_penalty[slot] != 0.0 or table.presence_penalty[slot] != 0.0:
        w[ids] = w[ids] - np.float64(table.frequency_penalty[slot]) * counts[ids]
        w[ids] = w[ids] - np.float64(table.presence_penalty[slot])
    return w


def choose_ref(x, slot, position, table, token_ids) -> int:
    w = adjusted_logits(x, slot, position, table, token_ids)
    t = np.float64(table.temperature[slot])
    if t < GREEDY_EPS:
        return int(np.argmax(w))
    m = w.max()
    if m == -np.inf:
        return 0
    s = (w - m) * (1.0 / t)
    e = np.where(s > EXP_CUTOFF, np.exp(np.maximum(s, EXP_CUTOFF)), 0.0)
    u = uniform(int(table.seed[slot]), position)
    k, p, mp = int(table.top_k[slot]), np.float64(table.top_p[slot]), np.float64(table.min_p[slot])
    if not (mp > 0.0 or 0 < k < e.size or p < 1.0):  # no filter: id order over the vocabulary
        cum = np.cumsum(e)
        i = int(np.searchsorted(cum, u * cum[-1], side="right"))
        return int(np.nonzero(e)[0][-1]) if i >= e.size else i
    if mp > 0.0:  # min_p first (vLLM), relative to the max probability, which has e == 1
        e[e < mp] = 0.0
    ids = np.nonzero(e > 0.0)[0]
    order = ids[np.lexsort((ids, -e[ids]))]  # descending probability, ties by lower id
    if 0 < k < order.size:
        order = order[:k]
    cum = np.cumsum(e[order])
    if p < 1.0:  # smallest prefix whose mass reaches top_p of the (top-k) mass; at least one
        n = int(np.searchsorted(cum, p * cum[-1], side="left"))
        order, cum = order[: n + 1], cum[: n + 1]
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    return int(order[min(i, order.size - 1)])


def raw_logprobs_ref(x, chosen: int, n: int):
    """(logprob, rank) of chosen (nan, 0 when chosen < 0) and the top n (ids, logprobs)."""
    x64 = x.astype(np.float64)
    m = x64.max()
    lp = x64 - (m + np.log(np.exp(x64 - m).sum()))
    ids = np.arange(x.size)
    order = np.lexsort((ids, -x64))[:n]
    if chosen < 0:
        return np.nan, 0, order, lp[order]
    rank = 1 + int(np.sum(x > x[chosen])) + int(np.sum(x[:chosen] == x[chosen]))
    return lp[chosen], rank, order, lp[order]


def sample_ref(logits, slots, positions, table, token_ids, num_tokens, num_top=20):
    """Returns (tokens, logprobs dict or None per row) and writes the mirror like the kernel."""
    tokens, lps = np.full(len(slots), -1, np.int32), []
    for b, (slot, pos) in enumerate(zip(slots.tolist(), positions.tolist(), strict=True)):
        if slot < 0:
            lps.append(None)
            continue
        tok = choose_ref(logits[b], slot, pos, table, token_ids)
        tokens[b] = tok
        token_ids[slot, pos], num_tokens[slot] = tok, pos + 1
        n = int(table.num_logprobs[slot])
        lps.append(None if n < 0 else raw_logprobs_ref(logits[b], tok, min(n, num_top)))
    return tokens, lps


def prompt_logprobs_ref(logits, next_ids, k):
    """Per position: (logprob, rank, top ids, top logprobs) of the raw distribution."""
    return [raw_logprobs_ref(logits[t], int(next_ids[t]), k) for t in range(len(logits))]
