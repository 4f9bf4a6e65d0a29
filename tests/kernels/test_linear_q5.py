"""Q5_0 / Q5_1 weights in the int8 (fast numerics) linear: against the float64 product of the
per-32-block int8 activations and the exactly decoded weights, and batch-invariant to the bit
(the float32 kernels' tests are in test_linear_kq.py)."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

from tests.kernels.kquant_blocks import random_kquant
from vtllm.kernels import QType
from vtllm.kernels.cpu import fast
from vtllm.kernels.cpu.linear_int8 import GEMM_MIN_M, MC, NC, linear_int8
from vtllm.kernels.cpu.quant import dequantize
from vtllm.kernels.cpu.quant_int8 import quantize_activations_ref
from vtllm.kernels.reference import linear_ref

ids = pytest.mark.parametrize("qtype", [QType.Q5_0, QType.Q5_1], ids=lambda q: q.name)


def run(x, w, qtype, bias=None):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    linear_int8(x, w, qtype, out, bias=bias)
    return out


@ids
@pytest.mark.parametrize("m", [1, 3, "gemm", 37])
def test_matches_reference(rng, qtype, m):
    m = GEMM_MIN_M if m == "gemm" else m
    for n, k in [(37, 96), (19, 544), (8, 576)]:  # odd block counts: a padded pair
        w = gguf_quantize(
            rng.standard_normal((n, k)).astype(np.float32), GGMLQuantizationType(qtype)
        )
        if n == 19:
            w = random_kquant(rng, qtype, n, k)  # raw blocks: any bits, subnormal scales
        x = rng.standard_normal((m, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        q, d, _ = quantize_activations_ref(x)
        xs = (q.astype(np.float64).reshape(m, -1, 32) * d[:, :, None]).reshape(m, k)
        mag = np.abs(xs) @ np.abs(dequantize(w, qtype).astype(np.float64)).T
        np.testing.assert_array_less(
            np.abs(run(x, w, qtype, bias) - linear_ref(xs, w, qtype, bias)), 1e-5 * mag + 1e-6
        )


@ids
def test_batch_invariance(rng, threads, qtype):
    n, k = NC + 37, 160
    w = random_kquant(rng, qtype, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((MC + 37, k)).astype(np.float32)
    with threads(2):
        full = run(x, w, qtype, bias)
        for lo, hi in [(3, 4), (MC + 30, MC + 33), (10, 10 + GEMM_MIN_M - 1), (0, 37)]:
            assert np.array_equal(run(x[lo:hi], w, qtype, bias), full[lo:hi]), (lo, hi)
    with threads(1):
        assert np.array_equal(run(x, w, qtype, bias), full)
        assert np.array_equal(run(x[5:6], w, qtype, bias), full[5:6])


def test_fast_table_routes_q5(rng):
    x = rng.standard_normal((3, 64)).astype(np.float32)
    for qtype in (QType.Q5_0, QType.Q5_1):
        w = random_kquant(rng, qtype, 9, 64)
        a, b = np.empty((3, 9), np.float32), np.empty((3, 9), np.float32)
        fast.linear(x, w, qtype, a)
        linear_int8(x, w, qtype, b)
        assert np.array_equal(a, b)
