"""rotary on the device vs the float64 reference; tokens with position -1 are left as they are."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host
from vtllm.kernels.cuda import rope_cos_sin, rotary
from vtllm.kernels.reference import rotary_ref

pytestmark = pytest.mark.cudasim

# (T, Hq, Hk, D)
SHAPES = [(4, 3, 1, 8), (2, 2, 2, 6)] + ([] if SIMULATOR else [(33, 32, 8, 128)])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(rng, shape):
    t, hq, hk, d = shape
    cos_sin = rope_cos_sin(64, d, 10000.0)
    q = rng.standard_normal((t, hq, d)).astype(np.float32)
    k = rng.standard_normal((t, hk, d)).astype(np.float32)
    positions = rng.integers(0, 64, t).astype(np.int32)
    positions[-1] = -1  # padding: untouched
    q_dev, k_dev = dev(q), dev(k)
    rotary(q_dev, k_dev, dev(positions), dev(cos_sin))
    live = positions >= 0
    ref_q, ref_k = rotary_ref(q[live], k[live], positions[live], cos_sin)
    got_q, got_k = host(q_dev), host(k_dev)
    np.testing.assert_allclose(got_q[live], ref_q, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got_k[live], ref_k, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(got_q[~live], q[~live])
    np.testing.assert_array_equal(got_k[~live], k[~live])


def test_rejects_bad_arguments():
    q = dev(np.ones((2, 2, 8), np.float32))
    cs = dev(rope_cos_sin(8, 8, 10000.0))
    with pytest.raises(ValueError, match="even D"):
        rotary(q, dev(np.ones((2, 1, 6), np.float32)), dev(np.zeros(2, np.int32)), cs)
    with pytest.raises(ValueError, match="positions"):
        rotary(q, q, dev(np.zeros(3, np.int32)), cs)
