"""Raw log-softmax on the CPU (logprobs of sampled and prompt tokens) and the float64 softmax
pieces the sampler shares: a vectorizable exp, blocked max and sum.

Batch invariance: every row is computed start to finish by one thread in a fixed order (no
fastmath; sums run in 8 fixed lanes), so a row's bits never depend on its batch.
"""

import numba as nb
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from vtllm.kernels.sampling_table import EXP_CUTOFF, MAX_TOP_LOGPROBS

_F64 = ir.DoubleType()
F32, I32 = np.dtype(np.float32), np.dtype(np.int32)
I32_1D, F32_1D, I32_2D, F32_2D = (
    types.Array(d, n, "C") for n in (1, 2) for d in (types.int32, types.float32)
)
LOGITS = types.Array(types.float32, 2, "C", readonly=True)  # also takes writable arrays


def parallel_kernel(sig):
    return nb.njit(sig, nogil=True, cache=True, parallel=True)


@intrinsic
def _f64_from_bits(typingctx, bits):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _F64)

    return types.float64(types.int64), codegen


_jit = nb.njit(nogil=True, cache=True)
_jit_inline = nb.njit(nogil=True, cache=True, inline="always")  # tiny helpers inside hot loops


@_jit_inline
def _exp_scaled(d, inv_t):
    """exp(d * inv_t) for d <= 0, 0 at or below EXP_CUTOFF. libm's exp is a scalar call (no SVML
    here); this Cody-Waite + degree-12 Taylor form vectorizes and is within 5e-16 relative."""
    s = d * inv_t
    c = s if s > EXP_CUTOFF else EXP_CUTOFF
    n = (c * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0  # round to integer
    r = (c - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10
    p = 1.0 / 479001600.0
    for k in (39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0, 24.0, 6.0, 2.0):
        p = p * r + 1.0 / k
    p = (p * r + 1.0) * r + 1.0
    e = p * _f64_from_bits((np.int64(n) + np.int64(1023)) << np.int64(52))
    return e if s > EXP_CUTOFF else 0.0


@_jit
def row_max(a):
    """Exact, so any order is fine; 8 lanes let LLVM vectorize it without fastmath."""
    m = np.full(8, -np.inf)
    n8 = a.size - a.size % 8
    for i in range(0, n8, 8):
        for j in range(8):
            m[j] = a[i + j] if a[i + j] > m[j] else m[j]
    for i in range(n8, a.size):
        m[0] = a[i] if a[i] > m[0] else m[0]
    return max(max(max(m[0], m[1]), max(m[2], m[3])), max(max(m[4], m[5]), max(m[6], m[7])))


@_jit
def exp_sum(src, m, inv_t, e):
    """e[i] = exp((src[i] - m) * inv_t); returns the sum in a fixed 8-lane order."""
    acc = np.zeros(8)
    n8 = src.size - src.size % 8
    for i in range(src.size):
        e[i] = _exp_scaled(np.float64(src[i]) - m, inv_t)
    for i in range(0, n8, 8):
        for j in range(8):
            acc[j] += e[i + j]
    for i in range(n8, src.size):
        acc[0] += e[i]
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))


@_jit
def raw_logprobs(x, chosen, n, e, top_ids, top_lps):
    """log_softmax of the raw row x (float32): the chosen id's (logprob, rank) and the top n.
    Order is by raw logit, ties by lower id; the rank counts ties the same way."""
    m = row_max(x)
    lse = m + np.log(exp_sum(x, m, 1.0, e))
    vals = np.full(max(n, 1), -np.inf, np.float32)
    top_ids[:] = -1
    top_lps[:] = -np.inf
    if n > 0:  # insertion into a sorted list of n; equal later ids never displace earlier ones
        for i in range(x.size):
            v = x[i]
            if v > vals[n - 1] or top_ids[n - 1] < 0:
                j = n - 1
                while j > 0 and (v > vals[j - 1] or top_ids[j - 1] < 0):
                    vals[j], top_ids[j] = vals[j - 1], top_ids[j - 1]
                    j -= 1
                vals[j], top_ids[j] = v, i
        for j in range(n):
            top_lps[j] = np.float64(vals[j]) - lse
    if chosen < 0:
        return np.float32(np.nan), 0
    xc = x[chosen]
    rank = 1
    for i in range(x.size):
        rank += (x[i] > xc) | ((x[i] == xc) & (i < chosen))
    return np.float32(np.float64(xc) - lse), rank


@parallel_kernel(types.int64(LOGITS, I32_1D, types.int64, F32_1D, I32_1D, I32_2D, F32_2D))
def _prompt_logprobs_kernel(logits, next_ids, k, out_logprob, out_rank, out_ids, out_lps):
    for t in prange(logits.shape[0]):
        e = np.empty(logits.shape[1])
        out_logprob[t], out_rank[t] = raw_logprobs(
            logits[t], np.int64(next_ids[t]), k, e, out_ids[t], out_lps[t]
        )
    return -1


def check_array(name, a, dtype, ndim, shape=None):
    """Checks run every step, so they stay cheap: dtype identity, one tuple compare."""
    if not isinstance(a, np.ndarray) or a.dtype is not dtype or a.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d {dtype.name} array")
    if not a.flags.c_contiguous or (shape is not None and a.shape != shape):
        raise ValueError(f"{name}: C-contiguous, shape {shape} expected, got {a.shape}")


def prompt_logprobs(logits, next_ids, k, out_logprob, out_rank, out_top_ids, out_top_logprobs):
    """Raw log_softmax at each position t of logits [T, V] float32: logprob and rank of
    next_ids[t] (-1: none; gives nan and rank 0) and the top k <= 20 into out_top_* [T, >= k];
    columns past k get -1 / -inf."""
    check_array("logits", logits, F32, 2)
    T, V = logits.shape
    check_array("next_ids", next_ids, I32, 1, (T,))
    check_array("out_logprob", out_logprob, F32, 1, (T,))
    check_array("out_rank", out_rank, I32, 1, (T,))
    check_array("out_top_ids", out_top_ids, I32, 2)
    check_array("out_top_logprobs", out_top_logprobs, F32, 2, out_top_ids.shape)
    if out_top_ids.shape[0] != T:
        raise ValueError(f"out_top_ids has {out_top_ids.shape[0]} rows, expected {T}")
    if not 0 <= k <= min(MAX_TOP_LOGPROBS, out_top_ids.shape[1]):
        raise ValueError(f"k = {k} must be in [0, min(20, out_top_ids.shape[1])]")
    if T and (next_ids.max() >= V or next_ids.min() < -1):
        raise ValueError("next_ids must be token ids or -1")
    _prompt_logprobs_kernel(
        logits, next_ids, k, out_logprob, out_rank, out_top_ids, out_top_logprobs
    )
