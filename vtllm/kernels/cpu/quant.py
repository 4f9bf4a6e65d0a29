"""Weight formats inside CPU kernels, plus numpy quantize()/dequantize() for tests and references.

Kernels see every weight matrix as uint8 bytes [N, row_bytes] (`weight_rows` makes that view
without copying), so one compiled signature serves all QTypes and a runtime `qt` picks the
decoder. Decoders return float32 lanes; every path (GEMV in registers, GEMM tile, embedding)
uses these same functions, so a weight decodes to the same float everywhere:
  F32 as is; F16 / BF16 widened exactly; Q4_0 d*(q-8); Q4_1 d*q + m (two roundings, as
  gguf-py and ggml compute it); Q8_0 d*q.
"""

import numpy as np
from numba import njit

from vtllm.kernels import BLOCK_BYTES, PER_TYPE, QK, QType, block_layout
from vtllm.kernels.cpu._simd import (
    bf16_to_f32,
    f16_to_f32,
    ld_bf16,
    ld_f16,
    ld_f32,
    vadd,
    vload,
    vload_bf16,
    vload_f16,
    vload_i8,
    vload_q4hi,
    vload_q4lo,
    vmul,
    vsplat,
    vstore,
    vsub,
)

__all__ = ["bf16_to_f32", "dequantize", "f16_to_f32", "quantize", "weight_rows"]

# numba folds module-level ints into constants; IntEnum members would work but ints are plainer.
F32, F16, Q4_0, Q4_1, Q8_0, BF16 = (
    int(q) for q in (QType.F32, QType.F16, QType.Q4_0, QType.Q4_1, QType.Q8_0, QType.BF16)
)
BB_Q4_0, BB_Q4_1, BB_Q8_0 = (BLOCK_BYTES[q] for q in (QType.Q4_0, QType.Q4_1, QType.Q8_0))
_ITEM_BYTES = {QType.F32: 4, QType.F16: 2, QType.BF16: 2}
_DTYPES = {QType.F32: np.float32, QType.F16: np.float16, QType.BF16: np.uint16}


# ---- block decoders: byte offset of a 32-weight block -> (elements 0..15, elements 16..31)


@njit(inline="always")
def q4_0_block(w, off):
    d = vsplat(ld_f16(w, off))
    eight = vsplat(np.float32(8.0))
    return vmul(d, vsub(vload_q4lo(w, off + 2), eight)), vmul(
        d, vsub(vload_q4hi(w, off + 2), eight)
    )


@njit(inline="always")
def q4_1_block(w, off):
    d = vsplat(ld_f16(w, off))
    m = vsplat(ld_f16(w, off + 2))
    return vadd(vmul(d, vload_q4lo(w, off + 4)), m), vadd(vmul(d, vload_q4hi(w, off + 4)), m)


@njit(inline="always")
def q8_0_block(w, off):
    d = vsplat(ld_f16(w, off))
    return vmul(d, vload_i8(w, off + 2)), vmul(d, vload_i8(w, off + 18))


@njit(inline="always")
def float_lanes(w, qt, off):
    """16 consecutive weights of a float format (F32 / F16 / BF16) at byte offset off."""
    if qt == F32:
        return vload(w, off)
    if qt == F16:
        return vload_f16(w, off)
    return vload_bf16(w, off)


@njit(inline="always")
def float_scalar(w, qt, off):
    """One weight of a float format at byte offset off (K % 16 tails)."""
    if qt == F32:
        return ld_f32(w, off)
    if qt == F16:
        return ld_f16(w, off)
    return ld_bf16(w, off)


@njit(inline="always")
def item_bytes(qt):
    return 4 if qt == F32 else 2


@njit(inline="always")
def dequant_row(w, qt, n, K, dst, dst_off):
    """dst.flat[dst_off : dst_off + K] = row n of w (uint8 [N, row_bytes]), decoded."""
    r = n * w.shape[1]
    if qt == Q4_0 or qt == Q4_1 or qt == Q8_0:
        for b in range(K // QK):
            if qt == Q4_0:
                lo, hi = q4_0_block(w, r + b * BB_Q4_0)
            elif qt == Q4_1:
                lo, hi = q4_1_block(w, r + b * BB_Q4_1)
            else:
                lo, hi = q8_0_block(w, r + b * BB_Q8_0)
            vstore(dst, dst_off + b * QK, lo)
            vstore(dst, dst_off + b * QK + 16, hi)
    else:
        ib = item_bytes(qt)
        k16 = K - K % 16
        for k in range(0, k16, 16):
            vstore(dst, dst_off + k, float_lanes(w, qt, r + k * ib))
        for k in range(k16, K):
            dst[dst_off + k] = float_scalar(w, qt, r + k * ib)


# ---- launcher side


def row_bytes(qtype: QType, k: int) -> int:
    layout = block_layout(qtype)
    if layout is not None:
        return k // layout[0] * layout[1]
    return k * _ITEM_BYTES[qtype]


def weight_rows(w: np.ndarray, qtype, k: int, op: str) -> np.ndarray:
    """Checks w against (qtype, K) and returns its uint8 [N, row_bytes] view (no copy)."""
    try:
        qtype = QType(qtype)
    except ValueError:
        raise ValueError(f"{op}: unsupported qtype {qtype!r}") from None
    layout = block_layout(qtype)
    want = np.uint8 if layout is not None else _DTYPES[qtype]
    if not isinstance(w, np.ndarray) or w.dtype != want or w.ndim != 2:
        raise ValueError(
            f"{op}: {qtype.name} weight must be a 2-D {np.dtype(want)} array, got "
            f"{getattr(w, 'dtype', type(w))} {getattr(w, 'shape', '')}"
        )
    if layout is not None and k % layout[0]:
        raise ValueError(f"{op}: {qtype.name} needs K % {layout[0]} == 0, got K={k}")
    if w.shape[1] != (row_bytes(qtype, k) if layout is not None else k):
        raise ValueError(f"{op}: {qtype.name} weight shape {w.shape} does not match K={k}")
    if not w.flags.c_contiguous:
        raise ValueError(f"{op}: weight must be C-contiguous")
    return w.view(np.uint8)


def dequantize(w: np.ndarray, qtype) -> np.ndarray:
    """float32 [N, K] from a weight in any QType (numpy; tests and references only)."""
    qtype = QType(qtype)
    if qtype == QType.F32:
        return np.array(w, dtype=np.float32)
    if qtype == QType.F16:
        return w.astype(np.float32)
    if qtype == QType.BF16:
        return (w.astype(np.uint32) << 16).view(np.float32)
    n = w.shape[0]
    if qtype in PER_TYPE:  # gguf-py's decoders, written from ggml's
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as gguf_dequantize

        if qtype == QType.Q8_K:  # gguf-py has no Q8_K decoder: d (float32) * q
            blocks = np.ascontiguousarray(w).reshape(-1, 292)
            d = blocks[:, :4].copy().view(np.float32)
            return (d * blocks[:, 4:260].view(np.int8).astype(np.float32)).reshape(n, -1)
        return gguf_dequantize(np.ascontiguousarray(w), GGMLQuantizationType(int(qtype)))
    blocks = w.reshape(-1, BLOCK_BYTES[qtype])
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    if qtype == QType.Q8_0:
        q = blocks[:, 2:].view(np.int8).astype(np.float32)
        return (d * q).reshape(n, -1)
    qs = blocks[:, 4:] if qtype == QType.Q4_1 else blocks[:, 2:]
    q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float32)
    if qtype == QType.Q4_0:
        return (d * (q - np.float32(8))).reshape(n, -1)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    return (d * q + m).reshape(n, -1)


def quantize(w: np.ndarray, qtype) -> np.ndarray:
    """Weights float32 [N, K] -> qtype storage, GGML's reference rounding (tests only)."""
    qtype = QType(qtype)
    w = np.asarray(w, dtype=np.float32)
    if qtype == QType.F32:
        return w.copy()
    if qtype == QType.F16:
        return w.astype(np.float16)
    if qtype == QType.BF16:  # round to nearest even on the dropped 16 bits
        bits = w.view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    n, k = w.shape
    if k % QK:
        raise ValueError(f"quantize: K={k} is not a multiple of {QK}")
    x = w.reshape(-1, QK)
    with np.errstate(divide="ignore", invalid="ignore"):
        if qtype == QType.Q8_0:
            d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
            q = np.sign(x * inv) * np.floor(np.abs(x * inv) + np.float32(0.5))  # roundf
            body = q.astype(np.int8).view(np.uint8)
            head = [d.astype(np.float16).view(np.uint8)]
        else:
            if qtype == QType.Q4_0:
                big = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)
                d = big / np.float32(-8)
                lo, shift = np.float32(0), np.float32(8.5)
                head = [d.astype(np.float16).view(np.uint8)]
            else:
                lo = x.min(axis=1, keepdims=True)
                d = (x.max(axis=1, keepdims=True) - lo) / np.float32(15)
                shift = np.float32(0.5)
                head = [d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8)]
            inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
            q = np.clip(np.trunc((x - lo) * inv + shift), 0, 15).astype(np.uint8)
            body = q[:, :16] | (q[:, 16:] << np.uint8(4))
    return np.concatenate(head + [body], axis=1).reshape(n, -1)
