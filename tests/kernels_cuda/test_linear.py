"""linear on the device vs the float64 reference on exactly decoded weights, every QType, for
M on both sides of the kernel's row tile (MT) and K with and without a tail."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import (
    ALL_QTYPES,
    FLOAT_QTYPES,
    QUANTIZED,
    SIMULATOR,
    dev,
    host,
    poisoned,
    random_blocks,
    random_weight,
)
from vtllm.kernels import QType
from vtllm.kernels.cpu.quant import dequantize
from vtllm.kernels.cuda import linear
from vtllm.kernels.reference import linear_ref

pytestmark = pytest.mark.cudasim

# (N, K): N not a multiple of the warps per block; K with a 32-column tail, K past one unrolled
# step, K odd (float formats only)
SHAPES = [(9, 160), (3, 64)] + ([] if SIMULATOR else [(4099, 4096), (257, 2080)])
FLOAT_SHAPES = [(5, 7), (6, 301), (4, 130)]  # scalar path (K % 4), unrolled; F32 words
MS = [1, 5] + ([] if SIMULATOR else [4, 8, 33])


def check_close(out, x, w, qtype, bias=None):
    """fp32 accumulation error bound, relative to sum |x| |w| (weights decode exactly)."""
    ref = linear_ref(x, w, qtype, bias)
    mag = np.abs(x.astype(np.float64)) @ np.abs(dequantize(w, qtype).astype(np.float64)).T
    if bias is not None:
        mag += np.abs(bias)
    k = x.shape[1]
    assert not np.isnan(out).any(), "unwritten outputs"
    np.testing.assert_array_less(np.abs(out - ref), 4e-7 * np.sqrt(k) * mag + 1e-6)


@pytest.mark.parametrize("qtype", ALL_QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("m", MS)
def test_matches_reference(rng, qtype, m):
    shapes = SHAPES + (FLOAT_SHAPES if qtype in FLOAT_QTYPES else [])
    for i, (n, k) in enumerate(shapes):
        w = random_weight(rng, qtype, n, k)
        if qtype in QUANTIZED and i == 1:  # raw blocks: every nibble / int8, subnormal scales
            w = random_blocks(rng, qtype, n, k)
        x = (rng.standard_normal((m, k)) * 2).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32) if i % 2 == 0 else None
        out = poisoned((m, n))
        linear(dev(x), dev(w), qtype, out, bias=None if bias is None else dev(bias))
        check_close(host(out), x, w, qtype, bias)


@pytest.mark.skipif(SIMULATOR, reason="the simulator's arrays carry no device address")
@pytest.mark.parametrize("qtype", FLOAT_QTYPES, ids=lambda q: q.name)
def test_misaligned_weight_takes_the_scalar_path(rng, qtype):
    """A weight that starts off an 8-byte boundary (carved from a flat buffer at an odd element)
    cannot be read as 64-bit words: the launcher must fall back, not fault."""
    n, k = 7, 100
    w = random_weight(rng, qtype, n, k)
    flat = dev(np.concatenate([w.ravel()[:1], w.ravel()]))
    x = rng.standard_normal((3, k)).astype(np.float32)
    out = poisoned((3, n))
    carved = flat[1:].reshape(n, k)
    assert carved.__cuda_array_interface__["data"][0] % 8
    linear(dev(x), carved, qtype, out)
    check_close(host(out), x, w, qtype)


def test_rejects_bad_arguments(rng):
    w = dev(random_weight(rng, QType.Q4_0, 4, 64))
    x = dev(rng.standard_normal((2, 64)).astype(np.float32))
    with pytest.raises(ValueError, match=r"shape \(2, 4\)"):
        linear(x, w, QType.Q4_0, poisoned((2, 5)))
    with pytest.raises(ValueError, match="uint8"):
        linear(x, w, QType.F32, poisoned((2, 4)))
    with pytest.raises(ValueError, match="K % 32"):
        linear(dev(np.ones((2, 40), np.float32)), w, QType.Q4_0, poisoned((2, 4)))
    with pytest.raises(ValueError, match="unsupported qtype"):
        linear(x, w, 99, poisoned((2, 4)))
    with pytest.raises(ValueError, match="bias"):
        linear(x, w, QType.Q4_0, poisoned((2, 4)), bias=dev(np.ones(3, np.float32)))


@pytest.mark.parametrize("qtype", ALL_QTYPES, ids=lambda q: q.name)
def test_a_row_has_the_same_bits_at_any_m(rng, qtype):
    """Batch invariance: a row computed alone (the one-row loop of a decode step) and inside a
    step of 5 rows (the four-row loop) round alike. On a card the compiler may contract the two
    loops' a * b + c into different fused multiply-adds; the GEMVs pin their fmas for that
    reason (the K-quant ones: test_linear_kquant)."""
    n, k = 9, 160
    w = random_weight(rng, qtype, n, k)
    x = (rng.standard_normal((5, k)) * 2).astype(np.float32)
    many, one = poisoned((5, n)), poisoned((1, n))
    linear(dev(x), dev(w), qtype, many)
    linear(dev(x[2:3]), dev(w), qtype, one)
    np.testing.assert_array_equal(host(one)[0], host(many)[2])
