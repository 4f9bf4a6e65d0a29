"""FP8 (e4m3fn) weight matrices on the device: packed for the tensor-core kernels at one byte a
weight, with a float32 scale per output row.

The host hands a matrix over as FP8_ROWS (vtllm.kernels: uint8 [N, K + 4], each row's K
codes, then its float32 scale), the layout that per-tensor and per-output-channel scales share:
a per-tensor scale is the same on every row. pack_fp8 lays the codes out in pack_bf16's tiles
and fragment order (_linear_mma: tile kt of row tile nt, lane L's A fragment), 8 bytes a lane
where bf16 takes 16: byte 2 r + h of lane L is register r's half h, so the lane's first word
becomes registers a0, a1 and its second a2, a3 (_ptx.e4m3x4_to_bf16x4). _linear_mma,
_linear_rows and _gemm_mma walk these tiles as they walk bf16 ones, run the same mmas on the
converted fragments and multiply each output by its row's scale before the bias, so every
route gives a row the same bits, as with bf16 W (_linear_mma's module docstring says why
weight-only). _gemm_wgmma refuses FP8 W: prefill takes _gemm_mma.

A matrix whose sides are not multiples of 16 cannot be packed: it goes up dequantized to
float32 (the values models/fp8 gives the CPU), for the F32 GEMV.
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._host import check
from vtllm.kernels.cuda._linear_mma import (
    FP8_TILE_WORDS,
    PACK_THREADS,
    PackedBF16,
    packable,
    packed_shape,
)
from vtllm.kernels.cuda._ptx import grid_dependency_sync

SCALE_BYTES = 4  # a row's float32 scale after its codes (FP8_ROWS)


@cuda.jit(cache=True)
def _pack_kernel(codes, packed):
    """One packed word per thread: word h of lane L in tile (nt, kt) holds registers 2 h and
    2 h + 1 of the lane's A fragment, rows 16 nt + g and g + 8, columns 16 kt + 2 t + 8 h and
    the next (g = L // 4, t = L % 4), a byte each, register 2 h's first; tiles past K are zeros."""
    grid_dependency_sync()
    i = cuda.grid(1)
    per_row = packed.shape[1]
    if i >= packed.shape[0] * per_row:
        return
    nt, rem = i // per_row, i % per_row
    kt, q = rem // FP8_TILE_WORDS, rem % FP8_TILE_WORDS
    lane, h = q // 2, q % 2
    row = 16 * nt + lane // 4
    col = 16 * kt + 2 * (lane % 4) + 8 * h
    if col >= codes.shape[1]:
        packed[nt, rem] = np.uint32(0)
        return
    packed[nt, rem] = (
        np.uint32(codes[row, col])
        | (np.uint32(codes[row, col + 1]) << np.uint32(8))
        | (np.uint32(codes[row + 8, col]) << np.uint32(16))
        | (np.uint32(codes[row + 8, col + 1]) << np.uint32(24))
    )


def pack_fp8(codes, scale, *, x_bf16=False, stream=0) -> PackedBF16:
    """codes (device uint8 [N, K], e4m3fn, N and K multiples of 16) copied into fragment order
    in a new device array, with scale (device float32 [N], kept as given): a PackedBF16 whose
    kernels convert the codes to bf16 and scale the rows (allocates: call at upload)."""
    check("pack_fp8", "codes", codes, np.uint8, 2)
    n, k = codes.shape
    check("pack_fp8", "scale", scale, np.float32, 1, (n,))
    if not packable(n, k):
        raise ValueError(f"pack_fp8: N and K must be positive multiples of 16, got {codes.shape}")
    packed = cuda.device_array(packed_shape(n, k, fp8=True), np.uint32, stream=stream)
    total = packed.shape[0] * packed.shape[1]
    _pack_kernel[-(-total // PACK_THREADS), PACK_THREADS, stream](codes, packed)
    return PackedBF16(packed, n, k, x_bf16, scale)


def split_rows(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """FP8_ROWS [N, K + 4] -> (codes uint8 [N, K], scales float32 [N]), host copies."""
    if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != k + SCALE_BYTES:
        raise ValueError(f"FP8 rows must be uint8 [N, {k} + {SCALE_BYTES}], got {rows.shape}")
    codes = np.ascontiguousarray(rows[:, :k])
    scale = np.ascontiguousarray(rows[:, k:]).view("<f4").reshape(-1).astype(np.float32)
    return codes, scale


def e4m3_values() -> np.ndarray:
    """float32 [256]: each code's value by the conversion's own steps (bits S.0000EEEE.MMM0..
    times 2^120); the NaN codes come out finite, and never occur in valid checkpoints."""
    code = np.arange(256, dtype=np.uint32)
    bits = ((code & 0x80) << 24) | ((code & 0x7F) << 20)
    return bits.view(np.float32) * np.float32(2.0**120)


def upload_fp8(rows: np.ndarray, shape: tuple[int, int], *, x_bf16: bool, stream):
    """(device data, packed): PackedBF16 of FP8 rows where the shape packs, else the float32
    values e4m3 x scale as a device [N, K] array (for QType.F32's GEMV)."""
    n, k = shape
    codes, scale = split_rows(rows, k)
    if not packable(n, k):
        values = e4m3_values()[codes] * scale[:, None]
        return cuda.to_device(np.ascontiguousarray(values, np.float32), stream=stream), False
    codes_dev = cuda.to_device(codes, stream=stream)
    packed = pack_fp8(codes_dev, cuda.to_device(scale, stream=stream), x_bf16=x_bf16, stream=stream)
    stream.synchronize()  # the codes' raw copy is freed on return
    return packed, True
