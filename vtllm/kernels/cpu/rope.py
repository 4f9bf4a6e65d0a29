"""Rotary position embedding (NeoX / HF rotate_half layout), in place on q and k.

Elementwise per (token, head): the result depends only on that row and its position, and the
same IEEE ops (no FMA contraction without fastmath) run in any vector body or scalar tail.
"""

import numpy as np
from numba import njit
from numba.core import types

from vtllm.kernels.cpu._simd import carray
from vtllm.kernels.rope_table import rope_cos_sin, rope_inv_freq

__all__ = ["rope_cos_sin", "rope_inv_freq", "rotary"]

_F = types.float32
_SIG = types.int64(carray(_F, 3), carray(_F, 3), carray(types.int32, 1, True), carray(_F, 2, True))


@njit(inline="always")
def _rotate(x, cs, half):
    for i in range(half):
        c = cs[i]
        s = cs[half + i]
        x1 = x[i]
        x2 = x[half + i]
        x[i] = x1 * c - x2 * s
        x[half + i] = x2 * c + x1 * s


@njit(_SIG, nogil=True, cache=True)
def _rotary_kernel(q, k, positions, cos_sin):
    T = q.shape[0]
    half = q.shape[2] // 2
    for t in range(T):  # validate every position before touching q or k
        if positions[t] < 0 or positions[t] >= cos_sin.shape[0]:
            return t
    for t in range(T):
        cs = cos_sin[positions[t]]
        for h in range(q.shape[1]):
            _rotate(q[t, h], cs, half)
        for h in range(k.shape[1]):
            _rotate(k[t, h], cs, half)
    return -1


def rotary(q: np.ndarray, k: np.ndarray, positions: np.ndarray, cos_sin: np.ndarray) -> None:
    """Rotates q [T, Hq, D] and k [T, Hk, D] in place by cos_sin[positions] ([max_pos, D]:
    cos in [:, :D/2], sin in [:, D/2:]): x[i], x[i+D/2] <- x1*cos - x2*sin, x2*cos + x1*sin."""
    for name, a in (("q", q), ("k", k)):
        if not (
            isinstance(a, np.ndarray)
            and a.dtype == np.float32
            and a.ndim == 3
            and a.flags.c_contiguous
        ):
            raise ValueError(
                f"rotary: {name} must be C-contiguous float32 [T, H, D], got "
                f"{getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')}"
            )
    t, _, d = q.shape
    if k.shape[0] != t or k.shape[2] != d or d % 2:
        raise ValueError(f"rotary: q {q.shape} and k {k.shape} need the same T and an even D")
    if not (
        isinstance(positions, np.ndarray)
        and positions.dtype == np.int32
        and positions.shape == (t,)
        and positions.flags.c_contiguous
    ):
        raise ValueError(f"rotary: positions must be contiguous int32 ({t},)")
    if not (
        isinstance(cos_sin, np.ndarray)
        and cos_sin.dtype == np.float32
        and cos_sin.ndim == 2
        and cos_sin.shape[1] == d
        and cos_sin.flags.c_contiguous
    ):
        raise ValueError(f"rotary: cos_sin must be C-contiguous float32 [max_pos, {d}]")
    bad = _rotary_kernel(q, k, positions, cos_sin)
    if bad >= 0:
        raise ValueError(
            f"rotary: position {positions[bad]} at {bad} is outside [0, {cos_sin.shape[0]})"
        )
