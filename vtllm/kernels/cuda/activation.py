"""silu(gate) * up for the gated MLP on the GPU, gelu_tanh(gate) * up for Gemma's GeGLU, and
the tanh soft-cap of logits. Hot path: keep it lean.

Elementwise over a grid-stride loop; silu(g) = g / (1 + exp(-g)) as the CPU kernel computes it
(`silu_mul`, which the decode linear's fused epilogue calls too: one expression, one rounding).
gelu with the tanh approximation is written as kernels/cpu/gelu writes it, g / (1 + exp(-2u))
with u = sqrt(2/pi) (g + 0.044715 g^3): silu's shape, never cancelling near u = 0.

Layouts of x [T, 2I]: gate columns then up columns, or, with tile=8, gate and up interleaved
in runs of 8 (columns 16 j .. 16 j + 7 are gate 8 j .., the next 8 up 8 j ..): the order of
a gate/up matrix packed for the tensor cores, whose 16-row tiles each hold 8 rows of both
(kernels/cuda/matmul), so that one block of the decode linear owns both halves of its outputs.
"""

import math

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR
from vtllm.kernels.cuda._host import check, grid_blocks
from vtllm.kernels.cuda._ptx import grid_dependency_sync

THREADS = 32 if SIMULATOR else 256
MAX_BLOCKS = 4 if SIMULATOR else 4096  # the grid-stride loop covers the rest

_GELU_C1 = np.float32(-2.0 * math.sqrt(2.0 / math.pi))  # -2u = g * (C1 + C3 g^2)
_GELU_C3 = np.float32(-2.0 * math.sqrt(2.0 / math.pi) * 0.044715)


def tile_interleave(a: np.ndarray, tile: int, axis: int = 0) -> np.ndarray:
    """a's two halves along axis (gate, up) interleaved in runs of tile (the module
    docstring): a host copy."""
    a = np.moveaxis(np.asarray(a), axis, 0)
    n = a.shape[0] // 2
    if a.shape[0] % 2 or n % tile:
        raise ValueError(f"tile_interleave: {a.shape[0]} is not two halves of whole {tile}-runs")
    runs = a.reshape(2, n // tile, tile, *a.shape[1:]).swapaxes(0, 1)
    return np.ascontiguousarray(np.moveaxis(runs.reshape(a.shape), 0, axis))


@cuda.jit(device=True)
def silu_mul(g, u):
    return g / (np.float32(1.0) + math.exp(-g)) * u


@cuda.jit(device=True)
def gelu_tanh_mul(g, u):
    return g / (np.float32(1.0) + math.exp(g * (_GELU_C1 + _GELU_C3 * (g * g)))) * u


@cuda.jit(device=True)
def _gate_up(x, t, i, n, tile):
    """(gate, up) of output column i of row t (the module docstring's layouts)."""
    if tile:
        return x[t, 2 * tile * (i // tile) + i % tile], x[
            t, 2 * tile * (i // tile) + tile + i % tile
        ]
    return x[t, i], x[t, n + i]


@cuda.jit(cache=True)
def _silu_and_mul_kernel(x, out, tile):
    grid_dependency_sync()
    n = out.shape[1]
    total = out.shape[0] * n
    for j in range(cuda.grid(1), total, cuda.gridsize(1)):
        t, i = j // n, j % n
        g, u = _gate_up(x, t, i, n, tile)
        out[t, i] = silu_mul(g, u)


@cuda.jit(cache=True)
def _gelu_tanh_and_mul_kernel(x, out, tile):
    grid_dependency_sync()
    n = out.shape[1]
    total = out.shape[0] * n
    for j in range(cuda.grid(1), total, cuda.gridsize(1)):
        t, i = j // n, j % n
        g, u = _gate_up(x, t, i, n, tile)
        out[t, i] = gelu_tanh_mul(g, u)


@cuda.jit(cache=True)
def _soft_cap_kernel(x, cap):
    grid_dependency_sync()
    n = x.shape[1]
    for j in range(cuda.grid(1), x.shape[0] * n, cuda.gridsize(1)):
        t, i = j // n, j % n
        x[t, i] = np.float32(math.tanh(x[t, i] / cap)) * cap


def _launch_gated(op, kernel, x, out, tile, stream) -> None:
    check(op, "x", x, np.float32, 2)
    if x.shape[1] % 2:
        raise ValueError(f"{op}: x must be [T, 2I], got {x.shape}")
    check(op, "out", out, np.float32, 2, (x.shape[0], x.shape[1] // 2))
    if tile < 0 or (tile and out.shape[1] % tile):
        raise ValueError(f"{op}: I = {out.shape[1]} is not a multiple of tile {tile}")
    total = out.shape[0] * out.shape[1]
    if total == 0:
        return
    blocks = min(MAX_BLOCKS, grid_blocks(total, THREADS))
    kernel[blocks, THREADS, stream](x, out, tile)


def silu_and_mul(x, out, *, tile: int = 0, stream=0) -> None:
    """out[T, I] = silu(gate) * up for x float32 [T, 2I] (device arrays): gate x[:, :I] and up
    x[:, I:], or with tile (I a multiple of it) interleaved in runs of tile columns (the
    module docstring)."""
    _launch_gated("silu_and_mul", _silu_and_mul_kernel, x, out, tile, stream)


def gelu_tanh_and_mul(x, out, *, tile: int = 0, stream=0) -> None:
    """out[T, I] = gelu_tanh(gate) * up, with x's layouts as in silu_and_mul."""
    _launch_gated("gelu_tanh_and_mul", _gelu_tanh_and_mul_kernel, x, out, tile, stream)


def soft_cap(x, cap: float, *, stream=0) -> None:
    """x [T, N] float32 <- cap * tanh(x / cap), in place (Gemma 2's final logits)."""
    check("soft_cap", "x", x, np.float32, 2)
    if not cap > 0:
        raise ValueError(f"soft_cap: cap must be positive, got {cap}")
    total = x.shape[0] * x.shape[1]
    if total == 0:
        return
    blocks = min(MAX_BLOCKS, grid_blocks(total, THREADS))
    _soft_cap_kernel[blocks, THREADS, stream](x, np.float32(cap))
