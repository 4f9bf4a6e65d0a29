"""What a BERT-family encoder needs beyond the decoder's kernels (numba njit, float32 in and out):
layer norm (with the residual add folded in), erf GELU, and attention of every token of a
sequence to every other token of it (no cache, no causal mask).

Batch invariance holds as for the decoder kernels: each row (or row and head) runs in one thread
in a fixed order, its sums in float64, so a sequence's output does not depend on what else is in
the batch. Compiled on first use: a decoder-only start never pays for them.
"""

import math

import numba as nb
import numpy as np
from numba import prange

_jit = nb.njit(nogil=True, cache=True, parallel=True)


@_jit
def _layer_norm(x, residual, weight, bias, eps, out):
    for r in prange(x.shape[0]):
        n = x.shape[1]
        mean = 0.0
        for i in range(n):
            mean += np.float64(x[r, i]) + np.float64(residual[r, i])
        mean /= n
        var = 0.0
        for i in range(n):
            d = np.float64(x[r, i]) + np.float64(residual[r, i]) - mean
            var += d * d
        inv = 1.0 / math.sqrt(var / n + eps)
        for i in range(n):
            d = np.float64(x[r, i]) + np.float64(residual[r, i]) - mean
            out[r, i] = np.float32(d * inv * weight[i] + bias[i])


def layer_norm(x, weight, bias, eps: float, out, *, residual=None) -> None:
    """out = LayerNorm(x + residual) * weight + bias over each row; float32 [T, H] (out may be
    x or residual); weight, bias float32 [H]."""
    _check("layer_norm", x, 2)
    if residual is None:
        residual = np.zeros_like(x)
    for name, a in (("residual", residual), ("out", out)):
        _check("layer_norm", a, 2, x.shape, name)
    for name, a in (("weight", weight), ("bias", bias)):
        _check("layer_norm", a, 1, (x.shape[1],), name)
    _layer_norm(x, residual, weight, bias, float(eps), out)


@_jit
def _gelu(x):
    flat = x.reshape(-1)
    for i in prange(flat.size):
        v = np.float64(flat[i])
        flat[i] = np.float32(0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))))


def gelu(x) -> None:
    """x = x * Phi(x) in place (the exact, erf form BERT uses); float32, C-contiguous."""
    _check("gelu", x, x.ndim)
    _gelu(x)


@_jit
def _attention(qkv, starts, num_heads, head_dim, scale, out):
    hidden = num_heads * head_dim
    T = qkv.shape[0]
    for job in prange(T * num_heads):
        t, h = job // num_heads, job % num_heads
        s = np.searchsorted(starts, t, side="right") - 1
        a, b = starts[s], starts[s + 1]
        q = qkv[t, h * head_dim : (h + 1) * head_dim]
        scores = np.empty(b - a)
        m = -np.inf
        for j in range(a, b):
            k = qkv[j, hidden + h * head_dim : hidden + (h + 1) * head_dim]
            acc = 0.0
            for d in range(head_dim):
                acc += np.float64(q[d]) * np.float64(k[d])
            scores[j - a] = acc * scale
            m = max(m, scores[j - a])
        z = 0.0
        for j in range(b - a):
            scores[j] = math.exp(scores[j] - m)
            z += scores[j]
        for d in range(head_dim):
            acc = 0.0
            for j in range(a, b):
                acc += scores[j - a] * np.float64(qkv[j, 2 * hidden + h * head_dim + d])
            out[t, h * head_dim + d] = np.float32(acc / z)


def encoder_attention(qkv, starts, num_heads: int, head_dim: int, out) -> None:
    """Each token attends to every token of its sequence (softmax(q k^T / sqrt(d)) v).
    qkv float32 [T, 3 * heads * head_dim] (q, k, v side by side); starts int64 [S + 1], the
    sequences' first rows and T last; out float32 [T, heads * head_dim]."""
    hidden = num_heads * head_dim
    _check("encoder_attention", qkv, 2)
    if qkv.shape[1] != 3 * hidden:
        raise ValueError(f"encoder_attention: qkv must be [T, {3 * hidden}], got {qkv.shape}")
    _check("encoder_attention", out, 2, (qkv.shape[0], hidden), "out")
    starts = np.ascontiguousarray(starts, np.int64)
    if starts[0] != 0 or starts[-1] != qkv.shape[0] or np.any(np.diff(starts) <= 0):
        raise ValueError("encoder_attention: starts must rise from 0 to T, no empty sequence")
    _attention(qkv, starts, num_heads, head_dim, 1.0 / math.sqrt(head_dim), out)


def _check(op: str, a, ndim: int, shape=None, name: str = "x") -> None:
    if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == ndim):
        raise ValueError(f"{op}: {name} must be a float32 {ndim}-D array")
    if shape is not None and a.shape != tuple(shape):
        raise ValueError(f"{op}: {name} must have shape {tuple(shape)}, got {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{op}: {name} must be C-contiguous")
