"""Which kernel multiplies a step's activations by a weight matrix, and the weight as it lives
on the device. Hot path: keep it lean.

A bf16 matrix with 16-aligned sides goes to the tensor cores, packed once at upload into mma
fragment order (_linear_mma.pack_bf16); every other storage type keeps the GEMV kernel of its
QType (linear). A packed gate/up matrix has its rows interleaved in runs of 8
(activation.tile_interleave), so that each 16-row tile holds 8 gate rows and their 8 up rows:
decode steps then get silu(gate) * up straight from the linear's epilogue (_linear_mma and
_linear_rows swiglu), and prefill steps (_gemm_mma) from silu_and_mul over that layout, with the
same bits.

Among the packed kernels every route gives the same bits, so a token's row never depends on
the size of its step: steps that gemm_pays for go to _gemm_mma (_gemm_wgmma where the weight
asks for it), batched-decode steps that rows_pay for to _linear_rows, the rest to _linear_mma.
The fused epilogues (a norm folded into the loads, the product added into the residual
stream) exist in _linear_mma only, for one-token steps.

K-quant matrices (Q2_K .. Q6_K) whose sides pack (N a multiple of 16, K of 256), where the
upload asks for it (kquant; opt-in until measured on a card), go to the same tensor-core
kernels, as integer codes and compact scales (_kquant_pack, upload_kquant), with every route and
fused epilogue of bf16 and the same rule of bits, M = 1 included; the numerics are the tensor
cores' (x as hi + lo bf16, or bf16 with x_bf16; codes exact; float32 sums per tile,
_kquant_pack), no longer the GEMV's float32 x times decoded weights. Other shapes, Q5_0 / Q5_1
and the rest keep their GEMV; _gemm_wgmma refuses K-quant W (never asked).

Mixed rows: GGUF K-quant files store q, k and v (sometimes gate and up) in different types
(Q4_K_M: attn_v in Q6_K beside Q4_K), which cannot be stacked into one matrix; MixedRows keeps
the parts and each one writes its own columns of the step's one output buffer: a packed part
through its tensor-core route on a view of those columns (the bits it gives alone), the
others through their GEMV at a column offset.

FP8 (FP8_ROWS: e4m3 codes and a scale per row) goes to the same tensor-core kernels, packed at
one byte a weight (_fp8.pack_fp8), with every route and fused epilogue of bf16 and the same
rule of bits; only _gemm_wgmma refuses it (an FP8 upload never asks for it). An FP8 matrix
whose sides do not pack goes up dequantized to float32 instead.

WGMMA: Hopper's warpgroup GEMM (_gemm_wgmma) is available; it runs only for weights uploaded
with wgmma (opt-in, VT_CUDA_PREFILL_GEMM=wgmma), never by default. linear: the GEMV kernels of
every QType on their own (what unpacked weights take).
"""

from dataclasses import dataclass

import numpy as np
from numba import cuda

from vtllm.kernels import FP8_ROWS, QType, block_layout
from vtllm.kernels.cuda._fp8 import upload_fp8
from vtllm.kernels.cuda._gemm_mma import gemm_mma, gemm_pays
from vtllm.kernels.cuda._gemm_wgmma import gemm_wgmma, round_x
from vtllm.kernels.cuda._kquant_pack import kq_packable, pack_kquant, scale_shape, tile_words
from vtllm.kernels.cuda._linear import linear
from vtllm.kernels.cuda._linear_kquant import TYPES as COLUMN_TYPES
from vtllm.kernels.cuda._linear_mma import (
    PREPACK_ABOVE,
    PackedBF16,
    linear_mma,
    pack_bf16,
    packable,
    packed_shape,
    split_x,
    x_scratch_words,
)
from vtllm.kernels.cuda._linear_rows import linear_rows, rows_pay
from vtllm.kernels.cuda._ptx_wgmma import WGMMA
from vtllm.kernels.cuda.activation import silu_and_mul, tile_interleave

__all__ = [
    "WGMMA",
    "DeviceWeight",
    "MixedRows",
    "for_tensor_cores",
    "linear",
    "upload_matrix",
    "upload_mixed",
    "x_scratch_words",
]


@dataclass(slots=True)
class DeviceWeight:
    data: object  # device array, layout per QType, or a PackedBF16 for the tensor cores
    qtype: int
    packed: bool = False  # bf16 or FP8 in mma fragment order (kernels/cuda/linear_mma)
    wgmma: bool = False  # packed bf16 with x_bf16, on Hopper: long steps take _gemm_wgmma

    def matmul(self, x, out, *, bias=None, x_scratch=None, act=None, stream=0) -> None:
        """out = x @ W.T (+ bias); x_scratch: see _linear_mma. act: W is a gate/up matrix and
        act [M, N / 2] gets silu(gate) * up, from the linear's epilogue where its kernel has
        one (out then unused), else by silu_and_mul over out (same bits)."""
        m, n = x.shape[0], out.shape[1]
        swiglu = act is not None
        split_step = self.packed and x_scratch is not None and m > PREPACK_ABOVE
        if split_step and gemm_pays(m, n) and self.wgmma:
            gemm_wgmma(
                round_x(x, x_scratch, stream=stream), self.data, out, bias=bias, stream=stream
            )
        elif split_step and gemm_pays(m, n):
            xp = split_x(x, x_scratch, x_bf16=self.data.x_bf16, stream=stream)
            gemm_mma(xp, self.data, out, bias=bias, stream=stream)
        elif split_step and rows_pay(m, n):
            xp = split_x(x, x_scratch, x_bf16=self.data.x_bf16, stream=stream)
            linear_rows(
                xp, self.data, act if swiglu else out, bias=bias, swiglu=swiglu, stream=stream
            )
            return
        elif self.packed:
            linear_mma(
                x,
                self.data,
                act if swiglu else out,
                bias=bias,
                x_scratch=x_scratch,
                swiglu=swiglu,
                stream=stream,
            )
            return
        else:
            linear(x, self.data, self.qtype, out, bias=bias, stream=stream)
        if swiglu:  # packed gate/up rows are interleaved in runs of 8 (the module docstring)
            silu_and_mul(out, act, tile=8 if self.packed else 0, stream=stream)

    def matmul_folded(
        self, x, out, *, bias=None, norm_weight=None, eps=0.0, accumulate=False, act=None, stream=0
    ) -> None:
        """A one-token step's fused epilogues (packed W only, _linear_mma): with norm_weight, x
        is the residual stream and the product is of rms_norm(x, norm_weight, eps); with
        accumulate, out += the product (the residual add). act: as in matmul."""
        swiglu = act is not None
        linear_mma(
            x,
            self.data,
            act if swiglu else out,
            bias=bias,
            norm_weight=norm_weight,
            eps=eps,
            accumulate=accumulate,
            swiglu=swiglu,
            stream=stream,
        )


@dataclass(slots=True)
class MixedRows:
    """Matrices of different storage types stacked along the output dimension (the module
    docstring); each part writes its columns of out: a packed part through its tensor-core
    route on a view of those columns (the bits it gives alone), the others through their
    GEMV at a column offset."""

    parts: list  # DeviceWeight: packed, or unpacked of a type in COLUMN_TYPES
    packed: bool = False  # every part packed, and not gate/up: one-token steps may fold

    def _columns(self):
        col = 0
        for part in self.parts:
            n = part.data.n if part.packed else part.data.shape[0]
            yield part, col, n
            col += n

    def matmul(self, x, out, *, bias=None, x_scratch=None, act=None, stream=0) -> None:
        for part, col, n in self._columns():
            if part.packed:
                part_bias = None if bias is None else bias[col : col + n]
                part.matmul(
                    x, out[:, col : col + n], bias=part_bias, x_scratch=x_scratch, stream=stream
                )
            else:
                linear(x, part.data, part.qtype, out, bias=bias, col0=col, stream=stream)
        if act is not None:
            silu_and_mul(out, act, tile=0, stream=stream)

    def matmul_folded(
        self, x, out, *, bias=None, norm_weight=None, eps=0.0, accumulate=False, act=None, stream=0
    ) -> None:
        """DeviceWeight.matmul_folded part by part (packed parts only, no act: packed is False
        for a gate/up MixedRows)."""
        if not self.packed or act is not None:
            raise ValueError("MixedRows.matmul_folded: every part must be packed, and no act")
        for part, col, n in self._columns():
            part.matmul_folded(
                x,
                out[:, col : col + n],
                bias=None if bias is None else bias[col : col + n],
                norm_weight=norm_weight,
                eps=eps,
                accumulate=accumulate,
                stream=stream,
            )


def upload_mixed(
    parts: list[tuple[np.ndarray, int]],
    *,
    gate_up: bool = False,
    x_bf16: bool = False,
    kquant: bool = False,
    stream,
) -> MixedRows:
    """MixedRows of (data, qtype) parts: with kquant, K-quant parts whose sides pack go to the
    tensor cores (x_bf16, kquant: as upload_matrix), the others up as stored; ValueError for
    a type whose kernel cannot write at a column offset. gate_up: the parts are gate and up
    (never folded: their rows cannot interleave across parts)."""
    weights = []
    for data, qtype in parts:
        if qtype not in COLUMN_TYPES:
            name = "FP8" if qtype == FP8_ROWS else QType(qtype).name
            raise ValueError(
                f"{name} cannot be stacked with other types here; "
                "mixed q/k/v or gate/up need K-quant or Q5_0 / Q5_1 parts"
            )
        per, nbytes = block_layout(qtype)
        shape = (data.shape[0], data.shape[1] // nbytes * per)
        if kquant and kq_packable(qtype, *shape):
            packed = upload_kquant(data, qtype, shape, x_bf16=x_bf16, stream=stream)
            weights.append(DeviceWeight(packed, qtype, packed=True))
        else:
            raw = cuda.to_device(np.ascontiguousarray(data), stream=stream)
            weights.append(DeviceWeight(raw, qtype))
    return MixedRows(weights, packed=not gate_up and all(w.packed for w in weights))


def for_tensor_cores(qtype: int, shape: tuple[int, int], *, kquant: bool = False) -> bool:
    """kquant: K-quant matrices that pack go to the tensor cores too (upload_matrix)."""
    return (qtype in (QType.BF16, FP8_ROWS) and packable(*shape)) or (
        kquant and kq_packable(qtype, *shape)
    )


def upload_kquant(rows: np.ndarray, qtype: int, shape: tuple[int, int], *, x_bf16=False, stream):
    """K-quant rows (uint8 [N, K / 256 x block bytes], N a multiple of 16, K of 256) packed for
    the tensor cores (_kquant_pack): a PackedBF16 of codes and scale records; the raw upload is
    freed on return."""
    n, k = shape
    if not kq_packable(qtype, n, k):
        raise ValueError(f"upload_kquant: {QType(qtype).name} [{n}, {k}] does not pack")
    raw = cuda.to_device(np.ascontiguousarray(rows), stream=stream)
    kq = int(qtype)
    packed = cuda.device_array(packed_shape(n, k, kq=kq), np.uint32, stream=stream)
    tiles = packed.shape[1] // tile_words(kq)
    scales = cuda.device_array(scale_shape(n, tiles, kq), np.uint32, stream=stream)
    pack_kquant(raw, kq, packed, scales, stream=stream)
    stream.synchronize()  # the raw copy is freed on return
    return PackedBF16(packed, n, k, x_bf16, scales, kq)


def upload_matrix(
    data: np.ndarray,
    qtype: int,
    shape: tuple[int, int],
    *,
    gate_up: bool = False,
    x_bf16: bool = False,
    wgmma: bool = False,
    kquant: bool = False,
    stream,
) -> DeviceWeight:
    """W on the device as matmul takes it: bf16 matrices with 16-aligned shapes packed for the
    tensor cores (the raw upload is freed), a fused gate/up one with its rows interleaved in
    runs of 8 first (the module docstring); every other type as stored. x_bf16: packed
    matrices multiply x rounded to bf16 (_linear_mma.PackedBF16); wgmma (with x_bf16): their
    long steps take _gemm_wgmma (bf16 only: FP8 and K-quant ones keep _gemm_mma). FP8_ROWS:
    packed as FP8 (_fp8), or dequantized to F32 where the shape does not pack. K-quant types,
    with kquant: packed by upload_kquant where the shape packs (a gate/up matrix's rows
    interleaved first, their scales with them); without, as stored, for their GEMV (the
    default until the packed path is measured on a card: VT_CUDA_KQUANT_TENSOR_CORES)."""
    if kquant and kq_packable(qtype, *shape):  # K-quant codes and scales (_kquant_pack)
        if gate_up:
            data = tile_interleave(data, 8)  # a row's scales are in its blocks
        packed = upload_kquant(data, qtype, shape, x_bf16=x_bf16, stream=stream)
        return DeviceWeight(packed, qtype, packed=True)
    if qtype == FP8_ROWS:
        if gate_up and packable(*shape):
            data = tile_interleave(data, 8)  # a row's scale travels with it
        weight, packed = upload_fp8(data, shape, x_bf16=x_bf16, stream=stream)
        return DeviceWeight(weight, qtype if packed else QType.F32, packed=packed)
    if not for_tensor_cores(qtype, shape):
        return DeviceWeight(cuda.to_device(np.ascontiguousarray(data), stream=stream), qtype)
    if gate_up:
        data = tile_interleave(data, 8)
    raw = cuda.to_device(np.ascontiguousarray(data), stream=stream)
    packed = pack_bf16(raw, x_bf16=x_bf16, stream=stream)
    stream.synchronize()  # the raw copy is freed on return
    return DeviceWeight(packed, qtype, packed=True, wgmma=wgmma and x_bf16)
