"""linear vs the float64 reference on exactly dequantized weights, quant helpers vs gguf-py,
and the bitwise batch-invariance law: a row's output is the same whatever M, the other rows,
the kernel path (GEMV / GEMM tiles) or the thread count."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from numba import njit

from vtllm.kernels import BLOCK_BYTES, PER_TYPE, QK, QType
from vtllm.kernels.cpu.linear import GEMM_MIN_M, MC, NC, NC_MIN, _gemm_kernel, linear
from vtllm.kernels.cpu.quant import bf16_to_f32, dequantize, f16_to_f32, quantize
from vtllm.kernels.reference import linear_ref

ALL = [q for q in QType if q not in PER_TYPE]  # the rest: test_linear_kq.py
FLOAT = [QType.F32, QType.F16, QType.BF16]


def random_weight(rng, qtype, n, k):
    """Quantized random floats, with per-row magnitudes that differ."""
    scale = rng.uniform(0.05, 2.0, (n, 1))
    return quantize((rng.standard_normal((n, k)) * scale).astype(np.float32), qtype)


def random_blocks(rng, qtype, n, k):
    """Raw random blocks; scales are random finite halves, subnormals included."""
    w = rng.integers(0, 256, (n, k // QK * BLOCK_BYTES[qtype]), dtype=np.uint8)
    blocks = w.reshape(-1, BLOCK_BYTES[qtype])
    heads = 2 if qtype == QType.Q4_1 else 1
    for h in range(heads):
        mags = 10.0 ** rng.uniform(-6.5, 0.5, len(blocks)) * rng.choice([-1, 1], len(blocks))
        blocks[:, 2 * h : 2 * h + 2] = mags.astype(np.float16)[:, None].view(np.uint8)
    return w


def run(x, w, qtype, bias=None):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    linear(x, w, qtype, out, bias=bias)
    return out


def check_close(out, x, w, qtype, bias=None):
    ref = linear_ref(x, w, qtype, bias)
    mag = np.abs(x.astype(np.float64)) @ np.abs(dequantize(w, qtype).astype(np.float64)).T
    np.testing.assert_array_less(np.abs(out - ref), 1e-5 * mag + 1e-6)


@pytest.mark.parametrize("qtype", ALL, ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 3, "gemm", 37])
def test_matches_reference(rng, qtype, m):
    m = GEMM_MIN_M[qtype] if m == "gemm" else m
    for n, k in [(37, 96), (64, 64), (5, 160)] + ([(9, 40), (6, 7)] if qtype in FLOAT else []):
        w = random_weight(rng, qtype, n, k)
        x = rng.standard_normal((m, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        check_close(run(x, w, qtype), x, w, qtype)
        check_close(run(x, w, qtype, bias), x, w, qtype, bias)


@pytest.mark.parametrize("qtype", [QType.Q4_0, QType.Q4_1, QType.Q8_0], ids=lambda q: q.name)
def test_random_raw_blocks(rng, qtype):
    w = random_blocks(rng, qtype, 45, 128)
    for m in (1, 20):
        x = rng.standard_normal((m, 128)).astype(np.float32)
        check_close(run(x, w, qtype), x, w, qtype)


@pytest.mark.parametrize("qtype", ALL, ids=lambda q: q.name)
def test_batch_invariance(rng, threads, qtype):
    """Rows alone (GEMV), in small and large batches (GEMM, several tiles and row panels), with
    1 and 2 threads: the same bits."""
    n, k = NC + 37, 96 if qtype not in FLOAT else 88
    w = random_weight(rng, qtype, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((MC + 37, k)).astype(np.float32)
    with threads(2):
        full = run(x, w, qtype, bias)
    with threads(1):
        assert np.array_equal(run(x, w, qtype, bias), full)
        assert np.array_equal(run(x[40:77], w, qtype, bias), full[40:77])
    with threads(2):
        g = GEMM_MIN_M[qtype]
        for lo, hi in [(3, 4), (MC + 30, MC + 33), (10, 10 + g - 1), (20, 20 + g), (0, 37)]:
            assert np.array_equal(run(x[lo:hi], w, qtype, bias), full[lo:hi]), (lo, hi)
        other = rng.standard_normal((7, k)).astype(np.float32)
        mixed = np.concatenate([other[:3], x[5:6], other[3:]])
        assert np.array_equal(run(mixed, w, qtype, bias)[3], full[5])
    check_close(full, x, w, qtype, bias)
    for tile_rows in (NC_MIN, NC):  # the tile size never shows in the bits either
        out = np.empty_like(full)
        _gemm_kernel(x, w.view(np.uint8), int(qtype), bias, out, tile_rows)
        assert np.array_equal(out, full)


def test_decoders_agree_with_gguf(rng):
    """Our quantize() is GGML's reference rounding and dequantize() its layout, byte for byte."""
    w = (rng.standard_normal((16, 256)) * rng.uniform(0.01, 3, (16, 1))).astype(np.float32)
    w[0, :32] = 0.0
    for qtype in (QType.Q4_0, QType.Q4_1, QType.Q8_0, QType.BF16):
        ours = quantize(w, qtype)
        gg = gguf_quantize(w, GGMLQuantizationType(int(qtype)))
        assert np.array_equal(ours.view(np.uint8), gg.view(np.uint8)), qtype.name
        raw = random_blocks(rng, qtype, 8, 64) if qtype in BLOCK_BYTES else ours
        back = gguf_dequantize(raw.view(np.uint8), GGMLQuantizationType(int(qtype)))
        assert np.array_equal(dequantize(raw, qtype), back.reshape(raw.shape[0], -1))


@njit
def _convert_all(bits, out16, outbf):
    for i in range(bits.size):
        out16[i] = f16_to_f32(bits[i])
        outbf[i] = bf16_to_f32(bits[i])


def test_half_conversions_exhaustive():
    bits = np.arange(1 << 16, dtype=np.uint16)
    f16, bf16 = np.empty(1 << 16, np.float32), np.empty(1 << 16, np.float32)
    _convert_all(bits, f16, bf16)
    np.testing.assert_array_equal(f16, bits.view(np.float16).astype(np.float32))  # NaN == NaN
    np.testing.assert_array_equal(bf16, (bits.astype(np.uint32) << 16).view(np.float32))
    sub = bits[1:1024]  # f16 subnormals: 2**-24 * mantissa
    assert np.array_equal(f16[1:1024], sub.astype(np.float32) * np.float32(2.0**-24))


def test_bad_inputs(rng):
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w = random_weight(rng, QType.Q4_1, 8, 64)
    out = np.empty((2, 8), np.float32)
    bad = [
        (x.astype(np.float64), w, QType.Q4_1, out, None),
        (x[:, ::2], random_weight(rng, QType.Q4_1, 8, 32), QType.Q4_1, out, None),
        (x, w, QType.Q4_0, out, None),  # wrong bytes per row for Q4_0
        (x, w[:, :-1], QType.Q4_1, out, None),
        (x, w.view(np.int8), QType.Q4_1, out, None),
        (x, w, 77, out, None),
        (x, w, QType.Q4_1, np.empty((2, 9), np.float32), None),
        (x, w, QType.Q4_1, np.empty((8, 2), np.float32).T, None),
        (x, w, QType.Q4_1, out, np.zeros(9, np.float32)),
        (x, w, QType.Q4_1, out, np.zeros(8, np.float64)),
        (x, rng.standard_normal((8, 64)), QType.F32, out, None),
        (x, np.zeros((8, 64), np.float16), QType.BF16, out, None),
        (
            rng.standard_normal((2, 48)).astype(np.float32),
            np.zeros((8, 30), np.uint8),
            QType.Q4_1,
            out,
            None,
        ),
    ]
    for args in bad:
        with pytest.raises(ValueError):
            linear(*args[:4], bias=args[4])


def test_read_only_weights(rng, tmp_path):
    """Memory-mapped (read-only) weights and bias, as the loaders hand them over."""
    w = random_weight(rng, QType.Q4_1, 9, 64)
    w.tofile(tmp_path / "w")
    mapped = np.memmap(tmp_path / "w", dtype=np.uint8, mode="r", shape=w.shape)
    bias = rng.standard_normal(9).astype(np.float32)
    bias.flags.writeable = False
    for m in (1, 9):
        x = rng.standard_normal((m, 64)).astype(np.float32)
        assert np.array_equal(run(x, mapped, QType.Q4_1, bias), run(x, w, QType.Q4_1, bias))
