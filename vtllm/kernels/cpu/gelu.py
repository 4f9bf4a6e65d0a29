"""gelu_tanh(gate) * up for the GeGLU MLP (Gemma), and tanh soft-capping of logits.

Elementwise, so batch invariance only needs every element computed by the same code, as in
activation.py: the 16-wide body and the scalar tail share vexp's arithmetic (exp32).

gelu with the tanh approximation, 0.5 g (1 + tanh(u)) with u = sqrt(2/pi) (g + 0.044715 g^3),
is written as g / (1 + exp(-2u)) (1 + tanh(u) = 2 / (1 + exp(-2u))): silu's shape, so it
takes the same vector exp and never cancels near u = 0.
"""

import math

import numpy as np
from numba import njit, prange
from numba.core import types

from vtllm.kernels.cpu._simd import carray, exp32, vadd, vdiv, vexp, vload, vmul, vsplat, vstore

PARALLEL_MIN = 1 << 16  # elements of out from which splitting rows over threads pays

_C1 = np.float32(-2.0 * math.sqrt(2.0 / math.pi))  # -2u = g * (_C1 + _C3 * g * g)
_C3 = np.float32(-2.0 * math.sqrt(2.0 / math.pi) * 0.044715)

_SIG = types.void(carray(types.float32, 2, True), carray(types.float32, 2))
_CAP_SIG = types.void(carray(types.float32, 2), types.float32)


@njit(inline="always")
def _row(x, out, t):
    n = out.shape[1]
    g0 = t * 2 * n
    o0 = t * n
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    one = vsplat(np.float32(1.0))
    c1, c3 = vsplat(_C1), vsplat(_C3)
    n16 = n - n % 16
    for j in range(0, n16, 16):
        g = vload(xf, g0 + j)
        m2u = vmul(g, vadd(c1, vmul(c3, vmul(g, g))))
        vstore(of, o0 + j, vmul(vdiv(g, vadd(one, vexp(m2u))), vload(xf, g0 + n + j)))
    for j in range(n16, n):
        g = xf[g0 + j]
        m2u = g * (_C1 + _C3 * (g * g))
        of[o0 + j] = g / (np.float32(1.0) + exp32(m2u)) * xf[g0 + n + j]


@njit(_SIG, nogil=True, cache=True)
def _gelu_kernel(x, out):
    for t in range(out.shape[0]):
        _row(x, out, t)


@njit(_SIG, nogil=True, parallel=True, cache=True)
def _gelu_parallel(x, out):
    for t in prange(out.shape[0]):
        _row(x, out, t)


@njit(_CAP_SIG, nogil=True, cache=True)
def _soft_cap_kernel(x, cap):
    for t in range(x.shape[0]):
        for j in range(x.shape[1]):
            x[t, j] = np.tanh(x[t, j] / cap) * cap


def _check(op, name, a, shape=None):
    ok = isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim == 2
    if not (ok and a.flags.c_contiguous and (shape is None or a.shape == shape)):
        want = "[T, N]" if shape is None else str(shape)
        raise ValueError(
            f"{op}: {name} must be C-contiguous float32 {want}, got "
            f"{getattr(a, 'dtype', type(a))} {getattr(a, 'shape', '')}"
        )


def gelu_tanh_and_mul(x: np.ndarray, out: np.ndarray) -> None:
    """out[T, I] = gelu_tanh(x[:, :I]) * x[:, I:] for x float32 [T, 2I]."""
    _check("gelu_tanh_and_mul", "x", x)
    if x.shape[1] % 2:
        raise ValueError(f"gelu_tanh_and_mul: x must be [T, 2I], got {x.shape}")
    _check("gelu_tanh_and_mul", "out", out, (x.shape[0], x.shape[1] // 2))
    if out.size >= PARALLEL_MIN:
        _gelu_parallel(x, out)
    else:
        _gelu_kernel(x, out)


def soft_cap(x: np.ndarray, cap: float) -> None:
    """x <- cap * tanh(x / cap), in place, in float32 (Gemma's logit soft-capping)."""
    _check("soft_cap", "x", x)
    if not cap > 0:
        raise ValueError(f"soft_cap: cap must be positive, got {cap}")
    _soft_cap_kernel(x, np.float32(cap))
