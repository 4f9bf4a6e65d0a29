"""silu(gate) * up for the gated MLP. Hot path: keep it lean.

Elementwise, so batch invariance only needs every element computed by the same code: the 16-wide
body and the scalar tail share vexp's exact arithmetic (see _simd.exp32), and the serial and
parallel kernels share the row function.
"""

import numpy as np
from numba import njit, prange
from numba.core import types

from vtllm.kernels.cpu._simd import (
    carray,
    exp32,
    vadd,
    vdiv,
    vexp,
    vload,
    vmul,
    vsplat,
    vstore,
    vsub,
)

PARALLEL_MIN = 1 << 16  # elements of out from which splitting rows over threads pays

_SIG = types.void(carray(types.float32, 2, True), carray(types.float32, 2))


@njit(inline="always")
def _row(x, out, t):
    n = out.shape[1]
    g0 = t * 2 * n
    o0 = t * n
    xf = x.reshape(x.size)
    of = out.reshape(out.size)
    one = vsplat(np.float32(1.0))
    zero = vsplat(np.float32(0.0))
    n16 = n - n % 16
    for j in range(0, n16, 16):
        g = vload(xf, g0 + j)
        silu = vdiv(g, vadd(one, vexp(vsub(zero, g))))
        vstore(of, o0 + j, vmul(silu, vload(xf, g0 + n + j)))
    for j in range(n16, n):
        g = xf[g0 + j]
        of[o0 + j] = g / (np.float32(1.0) + exp32(np.float32(0.0) - g)) * xf[g0 + n + j]


@njit(_SIG, nogil=True, cache=True)
def _silu_and_mul_kernel(x, out):
    for t in range(out.shape[0]):
        _row(x, out, t)


@njit(_SIG, nogil=True, parallel=True, cache=True)
def _silu_and_mul_parallel(x, out):
    for t in prange(out.shape[0]):
        _row(x, out, t)


def silu_and_mul(x: np.ndarray, out: np.ndarray) -> None:
    """out[T, I] = silu(x[:, :I]) * x[:, I:] for x float32 [T, 2I]; silu(g) = g / (1 + exp(-g))."""
    if not (
        isinstance(x, np.ndarray)
        and x.dtype == np.float32
        and x.ndim == 2
        and x.shape[1] % 2 == 0
        and x.flags.c_contiguous
    ):
        raise ValueError(
            f"silu_and_mul: x must be C-contiguous float32 [T, 2I], got "
            f"{getattr(x, 'dtype', type(x))} {getattr(x, 'shape', '')}"
        )
    shape = (x.shape[0], x.shape[1] // 2)
    if not (
        isinstance(out, np.ndarray)
        and out.dtype == np.float32
        and out.shape == shape
        and out.flags.c_contiguous
    ):
        raise ValueError(
            f"silu_and_mul: out must be C-contiguous float32 {shape}, got "
            f"{getattr(out, 'dtype', type(out))} {getattr(out, 'shape', '')}"
        )
    if out.size >= PARALLEL_MIN:
        _silu_and_mul_parallel(x, out)
    else:
        _silu_and_mul_kernel(x, out)
