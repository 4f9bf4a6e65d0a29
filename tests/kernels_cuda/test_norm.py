"""rms_norm on the device vs the float64 reference, with and without the fused residual."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from vtllm.kernels.cuda import rms_norm
from vtllm.kernels.reference import rms_norm_ref

pytestmark = pytest.mark.cudasim

# (2, 300) spans several of the kernel's chunks under the simulator, (2, 5000) on the GPU
SHAPES = [(3, 40), (1, 7), (2, 300)] + ([] if SIMULATOR else [(17, 4096), (2, 5000)])


def close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6 * np.abs(ref).max())


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(rng, shape):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, shape[1]).astype(np.float32)
    out = poisoned(shape)
    rms_norm(dev(x), dev(weight), 1e-5, out)
    close(host(out), rms_norm_ref(x, weight, 1e-5))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_residual_and_out_is_x(rng, shape):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    res = rng.standard_normal(shape).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, shape[1]).astype(np.float32)
    ref, ref_res = rms_norm_ref(x, weight, 1e-6, res)
    x_dev, res_dev = dev(x), dev(res)
    rms_norm(x_dev, dev(weight), 1e-6, x_dev, residual=res_dev)  # out is x
    close(host(x_dev), ref)
    np.testing.assert_array_equal(host(res_dev), (x + res).astype(np.float32))
    assert np.allclose(ref_res, x.astype(np.float64) + res)


def test_rejects_bad_arguments(rng):
    x = dev(np.ones((2, 8), np.float32))
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, dev(np.ones(7, np.float32)), 1e-5, poisoned((2, 8)))
    with pytest.raises(ValueError, match="residual"):
        rms_norm(x, dev(np.ones(8, np.float32)), 1e-5, x, residual=poisoned((2, 9)))
