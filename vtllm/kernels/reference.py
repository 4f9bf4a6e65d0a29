"""numpy float64 references for the kernels: same argument meaning as the launchers, but they
return new arrays instead of writing into `out`. Slow and obvious on purpose."""

import numpy as np

from vtllm.kernels.cpu.quant import dequantize


def linear_ref(x, w, qtype, bias=None):
    """[M, N] = x @ W.T (+ bias), W decoded exactly (dequantize)."""
    y = np.asarray(x, np.float64) @ dequantize(w, qtype).astype(np.float64).T
    return y if bias is None else y + np.asarray(bias, np.float64)


def embedding_ref(token_ids, w, qtype):
    """[T, K] rows of W."""
    return dequantize(w, qtype).astype(np.float64)[np.asarray(token_ids)]


def rms_norm_ref(x, weight, eps, residual=None):
    """out, or (out, new residual) when residual is given (v = x + residual is normalized)."""
    v = np.asarray(x, np.float64)
    if residual is not None:
        v = v + residual
    out = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * np.asarray(weight, np.float64)
    return out if residual is None else (out, v)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rotary_ref(q, k, positions, cos_sin):
    """(rotated q, rotated k), NeoX / rotate_half layout; cos_sin [max_pos, D] as rope_cos_sin."""
    cs = np.asarray(cos_sin, np.float64)[np.asarray(positions)]
    half = cs.shape[-1] // 2
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    return _rotate(np.asarray(q, np.float64), cos, sin), _rotate(
        np.asarray(k, np.float64), cos, sin
    )


def write_kv_ref(k, v, k_cache, v_cache, slot_mapping):
    """(new k_cache, new v_cache): row t stored at slot_mapping[t] unless it is -1."""
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    bs = k_cache.shape[1]
    for t, slot in enumerate(np.asarray(slot_mapping)):
        if slot >= 0:
            k_cache[slot // bs, slot % bs] = k[t]
            v_cache[slot // bs, slot % bs] = v[t]
    return k_cache, v_cache


def paged_attention_ref(
    q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window=0, softcap=0.0
):
    """[T, Hq, D] causal softmax(q.k * scale) @ v per sequence over its paged context; rows of q
    outside every sequence are zero. window > 0: a query sees its last window positions only
    (itself included); softcap > 0: scores s become softcap * tanh(s / softcap)."""
    t_all, hq, d = q.shape
    bs, hk = k_cache.shape[1], k_cache.shape[2]
    out = np.zeros((t_all, hq, d))
    for s in range(len(seq_lens)):
        ctx = int(seq_lens[s])
        q0, q1 = int(query_start_loc[s]), int(query_start_loc[s + 1])
        slots = block_tables[s][np.arange(ctx) // bs] * bs + np.arange(ctx) % bs
        keys = k_cache.reshape(-1, hk, d)[slots].astype(np.float64)  # [ctx, Hk, D]
        vals = v_cache.reshape(-1, hk, d)[slots].astype(np.float64)
        for i, t in enumerate(range(q0, q1)):
            pos = ctx - (q1 - q0) + i
            for h in range(hq):
                kv = h // (hq // hk)
                first = max(0, pos + 1 - window) if window else 0
                scores = keys[first : pos + 1, kv] @ q[t, h].astype(np.float64) * scale
                if softcap:
                    scores = softcap * np.tanh(scores / softcap)
                p = np.exp(scores - scores.max())
                out[t, h] = p @ vals[first : pos + 1, kv] / p.sum()
    return out


def silu_and_mul_ref(x):
    """[T, I] silu(x[:, :I]) * x[:, I:]."""
    x = np.asarray(x, np.float64)
    g, u = np.split(x, 2, axis=-1)
    return g / (1 + np.exp(-g)) * u


def gelu_tanh_and_mul_ref(x):
    """[T, I] gelu_tanh(x[:, :I]) * x[:, I:] (gelu's tanh approximation)."""
    x = np.asarray(x, np.float64)
    g, u = np.split(x, 2, axis=-1)
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u


def soft_cap_ref(x, cap):
    """cap * tanh(x / cap)."""
    return cap * np.tanh(np.asarray(x, np.float64) / cap)


# Sampling references are appended below by their owner.


def quantize_q8k_ref(x):
    """(q int8 [M, K], d float32 [M, K / 256]): x per 256-block as linear_kq8 quantizes it,
    d = max|x| / 127 and q = round(x / d) (half away from zero), as float32 computes them."""
    x = np.asarray(x, np.float32)
    m, k = x.shape
    blocks = x.reshape(m, k // 256, 256)
    d = np.abs(blocks).max(axis=2) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = blocks * inv[:, :, None]
    q = np.sign(v) * np.minimum(np.floor(np.abs(v) + np.float32(0.5)), 127)
    return q.astype(np.int8).reshape(m, k), d


def linear_kq8_ref(x, w, qtype, bias=None):
    """[M, N]: the int8 K-quant linear's result in float64, x replaced by its q8_K form."""
    q, d = quantize_q8k_ref(x)
    xs = q.astype(np.float64).reshape(d.shape[0], d.shape[1], 256) * d[:, :, None]
    return linear_ref(xs.reshape(q.shape), w, qtype, bias)


def route_top_k_ref(logits, k, renormalize):
    """(ids [T, k], weights [T, k]): softmax over the experts, rounded to float32 as the
    kernel keeps it, then the k largest in a stable order (ties to the lower index)."""
    z = np.asarray(logits, np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, axis=1).astype(np.float64)
    if renormalize:
        w /= w.sum(axis=1, keepdims=True)
    return ids, w


def combine_ref(ys, position, weights):
    """[T, hidden]: per token, sum over r of weights[t, r] * ys[position[t * k + r]]."""
    t, k = weights.shape
    rows = np.asarray(ys, np.float64)[np.asarray(position)].reshape(t, k, -1)
    return (np.asarray(weights, np.float64)[:, :, None] * rows).sum(axis=1)
