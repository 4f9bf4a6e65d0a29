"""silu(gate) * up for the gated MLP on the GPU. Hot path: keep it lean.

Elementwise over a grid-stride loop; silu(g) = g / (1 + exp(-g)) as the CPU kernel computes it.
"""

import math

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR
from vtllm.kernels.cuda._host import check, grid_blocks
from vtllm.kernels.cuda._ptx import grid_dependency_sync

THREADS = 32 if SIMULATOR else 256
MAX_BLOCKS = 4 if SIMULATOR else 4096  # the grid-stride loop covers the rest


@cuda.jit(cache=True)
def _silu_and_mul_kernel(x, out):
    grid_dependency_sync()
    n = out.shape[1]
    total = out.shape[0] * n
    for j in range(cuda.grid(1), total, cuda.gridsize(1)):
        t, i = j // n, j % n
        g = x[t, i]
        out[t, i] = g / (np.float32(1.0) + math.exp(-g)) * x[t, n + i]


def silu_and_mul(x, out, *, stream=0) -> None:
    """out[T, I] = silu(x[:, :I]) * x[:, I:] for x float32 [T, 2I] (device arrays)."""
    check("silu_and_mul", "x", x, np.float32, 2)
    if x.shape[1] % 2:
        raise ValueError(f"silu_and_mul: x must be [T, 2I], got {x.shape}")
    check("silu_and_mul", "out", out, np.float32, 2, (x.shape[0], x.shape[1] // 2))
    total = out.shape[0] * out.shape[1]
    if total == 0:
        return
    blocks = min(MAX_BLOCKS, grid_blocks(total, THREADS))
    _silu_and_mul_kernel[blocks, THREADS, stream](x, out)
