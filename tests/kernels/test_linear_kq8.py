"""The int8 (fast numerics) linear over K-quant weights (Q2_K .. Q6_K, q8_K activations):
against the float64 product of the quantized activations and the exactly decoded weights,
within the activation rounding bound of x @ W, and batch-invariant to the bit."""

import numpy as np
import pytest

from tests.kernels.kquant_blocks import random_kquant
from vtllm.kernels import QType
from vtllm.kernels.cpu import fast, linear
from vtllm.kernels.cpu.linear_int8 import MC, NC, NC_MIN, linear_int8
from vtllm.kernels.cpu.linear_kq8 import GEMM_MIN_M, kernels
from vtllm.kernels.cpu.quant import dequantize
from vtllm.kernels.reference import linear_kq8_ref, linear_ref, quantize_q8k_ref

KQ8 = [QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K]
ids = pytest.mark.parametrize("qtype", KQ8, ids=lambda q: q.name)
SHAPES = [(37, 256), (5, 768), (64, 512)]


def run(x, w, qtype, bias=None):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    linear_int8(x, w, qtype, out, bias=bias)
    return out


@ids
@pytest.mark.parametrize("m", [1, 3, "gemm", 37])
def test_matches_reference(rng, qtype, m):
    """Integer super-block sums are exact; what is left is float32 rounding of the scale
    products, one int -> float conversion per lane and the sum over super-blocks."""
    m = GEMM_MIN_M if m == "gemm" else m
    for n, k in SHAPES:
        w = random_kquant(rng, qtype, n, k)
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :256] *= 50  # blocks of very different scales
        bias = rng.standard_normal(n).astype(np.float32)
        q, d = quantize_q8k_ref(x)
        xs = np.abs(q.astype(np.float64).reshape(m, -1, 256) * d[:, :, None]).reshape(m, k)
        mag = xs @ np.abs(dequantize(w, qtype).astype(np.float64)).T
        for b in (None, bias):
            ref = linear_kq8_ref(x, w, qtype, b)
            np.testing.assert_array_less(np.abs(run(x, w, qtype, b) - ref), 1e-5 * mag + 1e-6)


@ids
def test_within_activation_bound_of_float64(rng, qtype):
    """Rounding x to int8 moves each element by at most d / 2 (d = the 256-block's max / 127),
    so each output by at most sum over blocks of d / 2 * sum |W| over the block."""
    w = random_kquant(rng, qtype, 40, 768)
    x = rng.standard_normal((6, 768)).astype(np.float32)
    wabs = np.abs(dequantize(w, qtype).astype(np.float64)).reshape(40, 3, 256).sum(axis=2)
    d = np.abs(x.reshape(6, 3, 256)).max(axis=2).astype(np.float64) / 127
    bound = 0.5 * d @ wabs.T
    err = np.abs(run(x, w, qtype) - linear_ref(x, w, qtype))
    assert np.all(err <= bound * 1.001 + 1e-6)
    assert err.max() > 0  # the activations were really quantized


@ids
def test_batch_invariance(rng, threads, qtype):
    """Rows alone (GEMV), in small and large batches (GEMM tiles, row panels), 1 and 2
    threads, any tile size: the same bits."""
    n, k = NC + 37, 512
    w = random_kquant(rng, qtype, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((MC + 37, k)).astype(np.float32)
    with threads(2):
        full = run(x, w, qtype, bias)
    with threads(1):
        assert np.array_equal(run(x, w, qtype, bias), full)
        assert np.array_equal(run(x[40:77], w, qtype, bias), full[40:77])
    with threads(2):
        g = GEMM_MIN_M
        for lo, hi in [(3, 4), (MC + 30, MC + 33), (10, 10 + g - 1), (20, 20 + g), (0, 37)]:
            assert np.array_equal(run(x[lo:hi], w, qtype, bias), full[lo:hi]), (lo, hi)
        other = rng.standard_normal((7, k)).astype(np.float32)
        mixed = np.concatenate([other[:3], x[5:6], other[3:]])
        assert np.array_equal(run(mixed, w, qtype, bias)[3], full[5])
    gemm = kernels(int(qtype))[1]
    for tile_rows in (NC_MIN, NC):
        out = np.empty_like(full)
        gemm(x, w, bias, out, tile_rows)
        assert np.array_equal(out, full)


def test_zero_rows_and_blocks(rng):
    """An all-zero 256-block of x (d = 0) contributes nothing, and never a NaN."""
    w = random_kquant(rng, QType.Q4_K, 8, 512)
    x = rng.standard_normal((5, 512)).astype(np.float32)
    x[1] = 0.0
    x[2, 256:] = 0.0
    out = run(x, w, QType.Q4_K)
    assert np.all(out[1] == 0) and np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[2:3], run(x[2:3, :256].copy(), w[:, :144].copy(), QType.Q4_K))


def test_fast_table_routes_kquants(rng):
    """Q2_K .. Q6_K take the int8 kernel in the fast table; Q8_K (an activation format that
    no file stores) keeps the exact one."""
    x = rng.standard_normal((3, 256)).astype(np.float32)
    for qtype in (QType.Q4_K, QType.Q6_K, QType.Q8_K):
        w = random_kquant(rng, qtype, 9, 256)
        a, b = np.empty((3, 9), np.float32), np.empty((3, 9), np.float32)
        fast.linear(x, w, qtype, a)
        (linear if qtype == QType.Q8_K else linear_int8)(x, w, qtype, b)
        assert np.array_equal(a, b), qtype.name
    with pytest.raises(ValueError, match="no int8 kernel"):
        linear_int8(x, random_kquant(rng, QType.Q8_K, 9, 256), QType.Q8_K, a)
