"""silu_and_mul on the device vs the float64 reference."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from vtllm.kernels.cuda import silu_and_mul
from vtllm.kernels.cuda.activation import tile_interleave
from vtllm.kernels.reference import silu_and_mul_ref

pytestmark = pytest.mark.cudasim

SHAPES = [(3, 22), (1, 2), (5, 300)] + ([] if SIMULATOR else [(64, 28672), (1, 2 * 8192)])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(rng, shape):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    out = poisoned((shape[0], shape[1] // 2))
    silu_and_mul(dev(x), out)
    ref = silu_and_mul_ref(x)
    np.testing.assert_allclose(host(out), ref, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(3, 32), (2, 48)], ids=str)
def test_tile_interleaved_layout_gives_the_same_bits(rng, shape):
    """gate and up in runs of 8 (the packed gate/up matrix's order): the same outputs, bit
    for bit, as the two halves side by side."""
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    plain, tiled = poisoned((shape[0], shape[1] // 2)), poisoned((shape[0], shape[1] // 2))
    silu_and_mul(dev(x), plain)
    silu_and_mul(dev(tile_interleave(x, 8, axis=1)), tiled, tile=8)
    np.testing.assert_array_equal(host(tiled), host(plain))


def test_tile_interleave_order():
    a = np.arange(32)
    got = tile_interleave(a, 8)
    np.testing.assert_array_equal(got[:16], np.r_[0:8, 16:24])
    np.testing.assert_array_equal(got[16:], np.r_[8:16, 24:32])
    with pytest.raises(ValueError, match="runs"):
        tile_interleave(np.arange(24), 8)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"\[T, 2I\]"):
        silu_and_mul(dev(np.ones((2, 3), np.float32)), poisoned((2, 1)))
    with pytest.raises(ValueError, match="out"):
        silu_and_mul(dev(np.ones((2, 4), np.float32)), poisoned((2, 4)))
    with pytest.raises(ValueError, match="multiple of tile"):
        silu_and_mul(dev(np.ones((2, 12), np.float32)), poisoned((2, 6)), tile=8)
