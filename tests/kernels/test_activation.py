"""silu_and_mul vs the reference; serial and parallel paths give rows the same bits."""

import numpy as np
import pytest

from vtllm.kernels.cpu.activation import PARALLEL_MIN, silu_and_mul
from vtllm.kernels.reference import silu_and_mul_ref


def run(x):
    out = np.full((x.shape[0], x.shape[1] // 2), np.nan, np.float32)
    silu_and_mul(x, out)
    return out


@pytest.mark.parametrize("i", [64, 1536, 45])
def test_matches_reference(rng, i):
    x = (rng.standard_normal((7, 2 * i)) * 4).astype(np.float32)
    x[0, :5] = [-100.0, -30.0, 0.0, 30.0, 100.0]  # saturated sigmoid at both ends
    np.testing.assert_allclose(run(x), silu_and_mul_ref(x), rtol=2e-6, atol=1e-30)


def test_batch_invariance(rng, threads):
    i = 200
    t = PARALLEL_MIN // i + 3  # big enough for the parallel kernel
    x = (rng.standard_normal((t, 2 * i)) * 4).astype(np.float32)
    with threads(2):
        full = run(x)
    with threads(1):
        assert np.array_equal(run(x), full)
        for row in (0, 37, t - 1):
            assert np.array_equal(run(x[row : row + 1])[0], full[row])
        assert np.array_equal(run(x[10:47]), full[10:47])


def test_bad_inputs(rng):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    for xx, out in [
        (x.astype(np.float64), np.empty((3, 4), np.float32)),
        (x[:, :7], np.empty((3, 3), np.float32)),
        (x, np.empty((3, 8), np.float32)),
        (x, np.empty((4, 3), np.float32).T),
        (np.asfortranarray(x), np.empty((3, 4), np.float32)),
    ]:
        with pytest.raises(ValueError):
            silu_and_mul(xx, out)


def test_read_only_input(rng):
    x = rng.standard_normal((2, 32)).astype(np.float32)
    want = run(x)
    x.flags.writeable = False
    assert np.array_equal(run(x), want)
