"""Compute kernels: numba njit on the CPU (cpu/), numba.cuda on GPUs (cuda/), numpy references.

Leaf package: imports nothing else of vtllm. Weight matrices are passed as (data, qtype):
- QType.F32: float32 [N, K]; F16: float16 [N, K]; BF16: uint16 bits [N, K]
- QType.Q4_0 / Q4_1 / Q8_0: uint8 [N, K // 32 * BLOCK_BYTES[qtype]], GGML block layout, row-major
"""

from enum import IntEnum


class QType(IntEnum):
    """Weight storage types, numbered as GGML numbers them."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q8_0 = 8
    BF16 = 30


QK = 32  # weights per quantized block
BLOCK_BYTES = {QType.Q4_0: 18, QType.Q4_1: 20, QType.Q8_0: 34}
QUANTIZED = frozenset(BLOCK_BYTES)
