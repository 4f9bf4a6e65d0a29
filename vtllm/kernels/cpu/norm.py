"""RMSNorm, optionally fused with the residual add. Hot path: keep it lean.

Row-wise by construction: a row's sum of squares runs over 16 lanes in K order and one fixed
tree (as in linear), so its result never depends on the other rows or on threads. Serial over
rows: T*H is tiny next to the linears, and at decode sizes a parallel launch costs more than
the work itself.
"""

import numpy as np
from numba import njit
from numba.core import types

from vtllm.kernels.cpu._simd import carray, fma32, hsum, vfma, vload, vzero

_F = types.float32
# x, weight, eps, out, residual (out itself when there is none), has_residual
_SIG = types.void(
    carray(_F, 2, True), carray(_F, 1, True), _F, carray(_F, 2), carray(_F, 2), types.boolean
)


@njit(_SIG, nogil=True, cache=True)
def _rms_norm_kernel(x, weight, eps, out, residual, has_residual):
    T, H = x.shape
    h16 = H - H % 16
    for t in range(T):
        if has_residual:
            for k in range(H):
                residual[t, k] = x[t, k] + residual[t, k]
            v = residual[t]
        else:
            v = x[t]
        acc = vzero()
        for k in range(0, h16, 16):
            a = vload(v, k)
            acc = vfma(a, a, acc)
        ss = hsum(acc)
        for k in range(h16, H):
            ss = fma32(v[k], v[k], ss)
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(H) + eps)
        for k in range(H):  # all of v is read before out[t] is written: out may alias x
            out[t, k] = weight[k] * (v[k] * inv)


def _check(name, a, shape):
    if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == shape):
        raise ValueError(
            f"rms_norm: {name} must be float32 {shape}, got "
            f"{getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')}"
        )
    if not a.flags.c_contiguous:
        raise ValueError(f"rms_norm: {name} must be C-contiguous")


def rms_norm(
    x: np.ndarray,
    weight: np.ndarray,
    eps: float,
    out: np.ndarray,
    *,
    residual: np.ndarray | None = None,
) -> None:
    """out = v / sqrt(mean(v*v) + eps) * weight, row by row, where v = x, or, with residual,
    v = residual <- x + residual (updated in place first). out may be x."""
    if not (isinstance(x, np.ndarray) and x.ndim == 2):
        raise ValueError(f"rms_norm: x must be float32 [T, H], got {getattr(x, 'shape', x)}")
    _check("x", x, x.shape)
    _check("weight", weight, (x.shape[1],))
    _check("out", out, x.shape)
    if residual is not None:
        _check("residual", residual, x.shape)
    dummy = out if residual is None else residual  # never written when has_residual is False
    _rms_norm_kernel(x, weight, eps, out, dummy, residual is not None)
