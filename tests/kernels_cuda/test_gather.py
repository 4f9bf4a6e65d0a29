"""The CUDA forward's data movement: mirror gather and row gather (exact copies)."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import dev, host, poisoned
from vtllm.kernels.cuda.gather import gather_rows, gather_tokens

pytestmark = pytest.mark.cudasim


def test_gather_tokens_reads_the_mirror_and_pads_with_zero(rng):
    mirror = rng.integers(1, 1000, (4, 9)).astype(np.int32)
    slots = np.array([2, -1, 0, 3, 5, 1], np.int32)  # -1 padding, 5 out of range
    positions = np.array([8, 0, 3, 0, 1, 9], np.int32)  # 9 out of range
    out = poisoned(6, np.int32)
    gather_tokens(dev(mirror), dev(slots), dev(positions), out)
    np.testing.assert_array_equal(host(out), [mirror[2, 8], 0, mirror[0, 3], mirror[3, 0], 0, 0])


def test_gather_rows(rng):
    x = rng.standard_normal((6, 7)).astype(np.float32)
    rows = np.array([5, 0, -1, 3], np.int32)
    out = poisoned((4, 7))
    gather_rows(dev(x), dev(rows), out)
    expected = x[[5, 0, 0, 3]].copy()
    expected[2] = 0.0
    np.testing.assert_array_equal(host(out), expected)
