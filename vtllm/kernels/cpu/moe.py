"""Mixture-of-experts routing on the CPU: top-k of the router's softmax, the routed rows grouped
by expert, and each token's experts summed back. Hot path: keep it lean.

The experts' linears run between these kernels over each expert's rows only (executor/cpu_ops):
`group_by_expert` orders the (token, rank) pairs by expert, the caller gathers x rows in that
order and runs expert e's linears over its slice, and `combine` adds, per token, weight * its
expert's row in rank order. Batch invariance: every token's routing and sum is one fixed
sequence of float32 operations of its own row alone, and the linear kernels are row-invariant,
so a token's bits do not depend on which tokens share its step or its experts.
"""

import math

import numpy as np
from numba import njit, prange
from numba.core import types

from vtllm.kernels.cpu._simd import carray, fma32

PARALLEL_MIN = 1 << 16  # elements of out from which splitting tokens over threads pays

_F32, _I32 = types.float32, types.int32
_ROUTE_SIG = types.void(carray(_F32, 2, True), types.boolean, carray(_I32, 2), carray(_F32, 2))
_GROUP_SIG = types.void(carray(_I32, 2, True), carray(_I32, 1), carray(_I32, 1), carray(_I32, 1))
_COMBINE_SIG = types.void(
    carray(_F32, 2, True), carray(_I32, 1, True), carray(_F32, 2, True), carray(_F32, 2)
)


@njit(_ROUTE_SIG, nogil=True, cache=True)
def _route_kernel(logits, renormalize, ids, weights):
    num_experts, k = logits.shape[1], ids.shape[1]
    probs = np.empty(num_experts, np.float32)
    taken = np.empty(num_experts, np.bool_)
    for t in range(logits.shape[0]):
        # softmax in float64, rounded once: the float32 probabilities closest to exact, which
        # is the nearest any float32 softmax (HF's included) can be
        top = -math.inf
        for e in range(num_experts):
            top = max(top, np.float64(logits[t, e]))
        total = 0.0
        for e in range(num_experts):
            total += math.exp(np.float64(logits[t, e]) - top)
        for e in range(num_experts):
            probs[e] = np.float32(math.exp(np.float64(logits[t, e]) - top) / total)
            taken[e] = False
        # k passes of argmax: strict > over ascending e, so ties go to the lower index
        kept = np.float32(0.0)
        for r in range(k):
            best = -1
            for e in range(num_experts):
                if not taken[e] and (best < 0 or probs[e] > probs[best]):
                    best = e
            taken[best] = True
            ids[t, r] = best
            weights[t, r] = probs[best]
            kept += probs[best]
        if renormalize:
            for r in range(k):
                weights[t, r] = weights[t, r] / kept


@njit(_GROUP_SIG, nogil=True, cache=True)
def _group_kernel(ids, order, position, offsets):
    k = ids.shape[1]
    offsets[:] = 0
    for t in range(ids.shape[0]):
        for r in range(k):
            offsets[ids[t, r] + 1] += 1
    for e in range(offsets.shape[0] - 1):
        offsets[e + 1] += offsets[e]
    fill = offsets[:-1].copy()
    for t in range(ids.shape[0]):  # stable: an expert's rows in token order
        for r in range(k):
            e = ids[t, r]
            order[fill[e]] = t * k + r
            position[t * k + r] = fill[e]
            fill[e] += 1


@njit(inline="always")
def _combine_row(ys, position, weights, out, t):
    k, hidden = weights.shape[1], out.shape[1]
    first, w = position[t * k], weights[t, 0]
    for j in range(hidden):
        out[t, j] = w * ys[first, j]
    for r in range(1, k):
        row, w = position[t * k + r], weights[t, r]
        for j in range(hidden):
            out[t, j] = fma32(w, ys[row, j], out[t, j])


@njit(_COMBINE_SIG, nogil=True, cache=True)
def _combine_kernel(ys, position, weights, out):
    for t in range(out.shape[0]):
        _combine_row(ys, position, weights, out, t)


@njit(_COMBINE_SIG, nogil=True, parallel=True, cache=True)
def _combine_parallel(ys, position, weights, out):
    for t in prange(out.shape[0]):
        _combine_row(ys, position, weights, out, t)


def _check(name: str, a, dtype, shape, *, writable: bool = False) -> None:
    ok = (
        isinstance(a, np.ndarray)
        and a.dtype == dtype
        and a.shape == shape
        and a.flags.c_contiguous
        and (a.flags.writeable or not writable)
    )
    if not ok:
        got = f"{getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')}"
        raise ValueError(f"moe: {name} must be C-contiguous {np.dtype(dtype)} {shape}, got {got}")


def route_top_k(logits: np.ndarray, renormalize: bool, ids: np.ndarray, weights: np.ndarray):
    """Per token (row of logits float32 [T, E]): softmax over the experts, then the top k
    (k = ids.shape[1]) by probability, descending, ties to the lower expert index. ids int32
    [T, k] gets the experts in that rank order, weights float32 [T, k] their probabilities,
    divided by their sum when renormalize."""
    t = logits.shape[0] if isinstance(logits, np.ndarray) and logits.ndim == 2 else -1
    _check("logits", logits, np.float32, (t, logits.shape[1] if t >= 0 else -1))
    k = ids.shape[1] if isinstance(ids, np.ndarray) and ids.ndim == 2 else -1
    if not 1 <= k <= logits.shape[1]:
        raise ValueError(f"moe: top-k {k} of {logits.shape[1]} experts")
    _check("ids", ids, np.int32, (t, k), writable=True)
    _check("weights", weights, np.float32, (t, k), writable=True)
    _route_kernel(logits, bool(renormalize), ids, weights)


def group_by_expert(ids, num_experts: int, order, position, offsets) -> None:
    """Sorts the T * k routed rows by expert, stably: order[j] = t * k + r of the j-th row,
    position its inverse, offsets [E + 1] where each expert's rows start (int32 all)."""
    if not (isinstance(ids, np.ndarray) and ids.ndim == 2):
        raise ValueError("moe: ids must be int32 [T, k]")
    _check("ids", ids, np.int32, ids.shape)
    if ids.size and not (0 <= ids.min() and ids.max() < num_experts):
        raise ValueError(f"moe: expert ids outside 0..{num_experts - 1}")
    _check("order", order, np.int32, (ids.size,), writable=True)
    _check("position", position, np.int32, (ids.size,), writable=True)
    _check("offsets", offsets, np.int32, (num_experts + 1,), writable=True)
    _group_kernel(ids, order, position, offsets)


def combine(ys, position, weights, out) -> None:
    """out[t] = sum over r in rank order of weights[t, r] * ys[position[t * k + r]]: ys float32
    [T * k, hidden] holds the experts' outputs in group_by_expert's order."""
    t = out.shape[0] if isinstance(out, np.ndarray) and out.ndim == 2 else -1
    _check("out", out, np.float32, (t, out.shape[1] if t >= 0 else -1), writable=True)
    k = weights.shape[1] if isinstance(weights, np.ndarray) and weights.ndim == 2 else -1
    _check("weights", weights, np.float32, (t, k))
    _check("ys", ys, np.float32, (t * k, out.shape[1]))
    _check("position", position, np.int32, (t * k,))
    if out.size >= PARALLEL_MIN:
        _combine_parallel(ys, position, weights, out)
    else:
        _combine_kernel(ys, position, weights, out)
