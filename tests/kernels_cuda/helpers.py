"""Shared by the kernels_cuda tests: device copies, NaN-poisoned outputs, random weights."""

import numpy as np
from numba import cuda

from vtllm.kernels import BLOCK_BYTES, PER_TYPE, QK, QType
from vtllm.kernels.cpu.quant import quantize
from vtllm.kernels.cuda import SIMULATOR

ALL_QTYPES = [q for q in QType if q not in PER_TYPE]  # those: test_linear_kquant
FLOAT_QTYPES = [QType.F32, QType.F16, QType.BF16]
QUANTIZED = [QType.Q4_0, QType.Q4_1, QType.Q8_0]


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def poisoned(shape, dtype=np.float32):
    """A device output filled with NaN (or -7 for ints): unwritten elements stay visible."""
    fill = np.nan if np.dtype(dtype).kind == "f" else -7
    return cuda.to_device(np.full(shape, fill, dtype))


def host(a):
    return a.copy_to_host()


def random_weight(rng, qtype, n, k):
    """Quantized random floats with per-row magnitudes that differ."""
    scale = rng.uniform(0.05, 2.0, (n, 1))
    return quantize((rng.standard_normal((n, k)) * scale).astype(np.float32), qtype)


def random_blocks(rng, qtype, n, k):
    """Raw random GGML blocks: any nibbles / int8s, random finite half scales incl. subnormals."""
    w = rng.integers(0, 256, (n, k // QK * BLOCK_BYTES[qtype]), dtype=np.uint8)
    blocks = w.reshape(-1, BLOCK_BYTES[qtype])
    for h in range(2 if qtype == QType.Q4_1 else 1):
        mags = 10.0 ** rng.uniform(-6.5, 0.5, len(blocks)) * rng.choice([-1, 1], len(blocks))
        blocks[:, 2 * h : 2 * h + 2] = mags.astype(np.float16)[:, None].view(np.uint8)
    return w


__all__ = [
    "ALL_QTYPES",
    "FLOAT_QTYPES",
    "QUANTIZED",
    "SIMULATOR",
    "dev",
    "host",
    "poisoned",
    "random_blocks",
    "random_weight",
]
