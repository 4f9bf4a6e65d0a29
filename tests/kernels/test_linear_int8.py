"""The int8 (fast numerics) linear: against a numpy model of the same quantization (integer
block dots are exact, so only the float32 order of the block sum differs), against the float64
reference within the activation rounding bound, batch invariance to the bit, the VNNI and
generic vpdpbusd against each other, and the instructions LLVM emits."""

import numpy as np
import pytest
from numba import njit

from tests.kernels.test_linear import random_blocks, random_weight
from vtllm.kernels import QK, QType
from vtllm.kernels.cpu import fast, linear
from vtllm.kernels.cpu._int8simd import (
    HAS_VNNI,
    dpbusd_generic,
    dpbusd_vnni,
    itof,
    load_b64,
    load_i16,
)
from vtllm.kernels.cpu._simd import vstore
from vtllm.kernels.cpu.linear_int8 import (
    GEMM_MIN_M,
    MC,
    NC,
    NC_MIN,
    _gemm_kernel,
    _gemv_kernel,
    linear_int8,
)
from vtllm.kernels.cpu.quant_int8 import (
    activation_error_bound,
    linear_int8_ref,
    quantize_activations_ref,
    weight_ints,
)
from vtllm.kernels.reference import linear_ref

QUANT = [QType.Q4_0, QType.Q4_1, QType.Q8_0]
# K = 96, 160, 544: odd block counts (a padded pair), 544 = 17 blocks (two Q4_1 groups)
SHAPES = [(37, 96), (64, 64), (5, 160), (19, 544), (8, 576)]


def run(x, w, qtype, bias=None):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    linear_int8(x, w, qtype, out, bias=bias)
    return out


def float_order_tolerance(x, w, qtype):
    """|kernel - linear_int8_ref| <= this: the block terms are the same float32 numbers, summed
    in float32 (at most ~nb + 4 roundings of partial sums no larger than sum |term|)."""
    q, dx, sx = quantize_activations_ref(x)
    wq, dw, mw = weight_ints(w, qtype)
    m, k = q.shape
    nb = k // QK
    qi, wi = q.astype(np.int64).reshape(m, nb, QK), wq.reshape(-1, nb, QK)
    dots = np.abs(np.einsum("mbk,nbk->mnb", qi, wi)) + 128 * np.abs(sx)[:, None, :]
    mag = (dots * np.abs(dw[None] * dx[:, None])).sum(axis=2)
    mag += np.abs(dx * sx) @ np.abs(mw).T
    return (nb + 8) * np.finfo(np.float32).eps * mag + 1e-30


@pytest.mark.parametrize("qtype", QUANT, ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 3, GEMM_MIN_M, 37])
def test_matches_int_reference(rng, qtype, m):
    for n, k in SHAPES:
        w = random_weight(rng, qtype, n, k)
        x = rng.standard_normal((m, k)).astype(np.float32) * rng.uniform(0.1, 4, (m, 1))
        x = x.astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        tol = float_order_tolerance(x, w, qtype)
        out = run(x, w, qtype)
        np.testing.assert_array_less(np.abs(out - linear_int8_ref(x, w, qtype)), tol)
        out = run(x, w, qtype, bias)
        ref = linear_int8_ref(x, w, qtype, bias)
        np.testing.assert_array_less(np.abs(out - ref), tol + 1e-6 * np.abs(ref))


@pytest.mark.parametrize("qtype", QUANT, ids=lambda q: q.name)
def test_within_activation_bound_of_float64(rng, qtype):
    """Rounding x to int8 moves each element by at most d/2 (d = block max / 127); the result
    moves by at most sum_b d_b/2 * sum|W_b| (activation_error_bound). Nothing else may be
    wrong: weights are used exactly."""
    for n, k in SHAPES:
        w = random_weight(rng, qtype, n, k)
        for m in (1, 9):
            x = rng.standard_normal((m, k)).astype(np.float32)
            x[0, :QK] *= 50  # one loud block
            err = np.abs(run(x, w, qtype) - linear_ref(x, w, qtype))
            bound = activation_error_bound(x, w, qtype)
            np.testing.assert_array_less(err, bound + float_order_tolerance(x, w, qtype))
            # and the bound is not vacuous: typical errors are well inside it
            assert np.median(err / bound) < 0.5


@pytest.mark.parametrize("qtype", QUANT, ids=lambda q: q.name)
def test_random_raw_blocks(rng, qtype):
    """Arbitrary bytes (Q8_0 -128 included) with tiny and subnormal f16 scales."""
    w = random_blocks(rng, qtype, 45, 128)
    for m in (1, 20):
        x = rng.standard_normal((m, 128)).astype(np.float32)
        ref = linear_int8_ref(x, w, qtype)
        np.testing.assert_array_less(
            np.abs(run(x, w, qtype) - ref), float_order_tolerance(x, w, qtype)
        )


def test_zero_and_tiny_blocks(rng):
    x = rng.standard_normal((3, 96)).astype(np.float32)
    x[0] = 0.0
    x[1, 32:64] = 1e-30
    w = random_weight(rng, QType.Q4_1, 7, 96)
    out = run(x, w, QType.Q4_1)
    assert np.all(out[0] == 0) and np.isfinite(out).all()
    np.testing.assert_allclose(out, linear_int8_ref(x, w, QType.Q4_1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("qtype", QUANT, ids=lambda q: q.name)
def test_batch_invariance(rng, threads, qtype):
    """A row's bits do not depend on M, the other rows, GEMV vs GEMM tiles or threads."""
    n, k = NC + 37, 544
    w = random_weight(rng, qtype, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((MC + 37, k)).astype(np.float32)
    with threads(2):
        full = run(x, w, qtype, bias)
    with threads(1):
        assert np.array_equal(run(x, w, qtype, bias), full)
        assert np.array_equal(run(x[40:77], w, qtype, bias), full[40:77])
    with threads(2):
        for lo, hi in [(3, 4), (MC + 30, MC + 33), (10, 10 + GEMM_MIN_M), (0, 37), (5, 7)]:
            assert np.array_equal(run(x[lo:hi], w, qtype, bias), full[lo:hi]), (lo, hi)
        other = rng.standard_normal((7, k)).astype(np.float32) * 30
        mixed = np.concatenate([other[:3], x[5:6], other[3:]])
        assert np.array_equal(run(mixed, w, qtype, bias)[3], full[5])
    for tile_rows in (NC_MIN, NC):  # the tile size never shows in the bits either
        out = np.empty_like(full)
        _gemm_kernel(x, w.view(np.uint8), int(qtype), bias, out, tile_rows)
        assert np.array_equal(out, full)
    for runs in (1, 2, 3, 7):  # the GEMV on the whole batch too, split into any number of runs
        out = np.empty_like(full)
        _gemv_kernel(x, w.view(np.uint8), int(qtype), bias, out, runs)
        assert np.array_equal(out, full), runs


@njit
def _dp_generic(acc, u, s, out):  # lanes below 2**24 pass through float32 exactly
    vstore(out, 0, itof(dpbusd_generic(load_i16(acc, 0), load_b64(u, 0), load_b64(s, 0))))


@njit
def _dp_vnni(acc, u, s, out):
    vstore(out, 0, itof(dpbusd_vnni(load_i16(acc, 0), load_b64(u, 0), load_b64(s, 0))))


def test_dpbusd_paths_agree(rng):
    """vpdpbusd semantics: lane i += sum_j u[4i+j] * s[4i+j], u unsigned, s signed, exact."""
    u = rng.integers(0, 256, 64, dtype=np.uint8)
    s = rng.integers(-128, 128, 64).astype(np.int8)
    acc = rng.integers(-(1 << 20), 1 << 20, 16).astype(np.int32)
    want = acc + (u.astype(np.int64) * s).reshape(16, 4).sum(axis=1)
    out = np.zeros(16, np.float32)
    _dp_generic(acc, u, s, out)
    assert np.array_equal(out, want)
    if HAS_VNNI:
        out[:] = 0
        _dp_vnni(acc, u, s, out)
        assert np.array_equal(out, want)


@pytest.mark.skipif(not HAS_VNNI, reason="host has no AVX512-VNNI")
def test_llvm_emits_vpdpbusd():
    """The GEMV body recompiled here without the cache (cached code cannot be inspected)."""
    fresh = njit(_gemv_kernel.signatures[0], nogil=True)(_gemv_kernel.py_func)
    asm = fresh.inspect_asm(fresh.signatures[0])
    assert "vpdpbusd" in asm and "vcvtdq2ps" in asm and "zmm" in asm
    assert "prefetcht0" in asm  # the weight stream's software prefetch


def test_fast_table_routes_by_qtype(rng):
    """Quantized weights take the int8 kernel; float weights keep the exact one, to the bit."""
    x = rng.standard_normal((5, 64)).astype(np.float32)
    for qtype in (QType.F32, QType.F16, QType.BF16, QType.Q4_1):
        w = random_weight(rng, qtype, 9, 64)
        a, b = np.empty((5, 9), np.float32), np.empty((5, 9), np.float32)
        fast.linear(x, w, qtype, a)
        if qtype == QType.Q4_1:
            linear_int8(x, w, qtype, b)
        else:
            linear(x, w, qtype, b)
        assert np.array_equal(a, b), qtype.name


def test_bad_inputs(rng):
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w = random_weight(rng, QType.Q4_1, 8, 64)
    out = np.empty((2, 8), np.float32)
    bad = [
        (x.astype(np.float64), w, QType.Q4_1, out, None),
        (x, w, QType.Q4_0, out, None),
        (x, random_weight(rng, QType.F32, 8, 64), QType.F32, out, None),
        (x, w, QType.Q4_1, np.empty((2, 9), np.float32), None),
        (x, w, QType.Q4_1, np.empty((8, 2), np.float32).T, None),
        (x, w, QType.Q4_1, out, np.zeros(9, np.float32)),
        (np.asfortranarray(np.ones((2, 64), np.float32)), w, QType.Q4_1, out, None),
    ]
    for args in bad:
        with pytest.raises(ValueError):
            linear_int8(*args[:4], bias=args[4])
