"""Constrained decoding's mask on the device: the CPU runner's numpy rule, bit for bit."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import dev, host
from vtllm.executor.step_layout import apply_token_masks as host_masks
from vtllm.kernels.cuda import apply_token_masks

pytestmark = pytest.mark.cudasim


def test_masks_match_the_host_rule_and_skip_unconstrained_rows(rng):
    B, V, M = 4, 100, 3  # V not a multiple of 32: the last word is partly past the vocabulary
    logits = rng.standard_normal((B, V)).astype(np.float32)
    bits = rng.integers(-(2**31), 2**31, (M, 3), dtype=np.int64).astype(np.int32)  # 96 < V
    mask_rows = np.array([2, -1, 0, 7], np.int32)  # -1: unconstrained; 7: out of range
    out = dev(logits)
    apply_token_masks(out, dev(bits), dev(mask_rows))
    expected = logits.copy()
    host_masks(expected, [(0, bits[2]), (2, bits[0])])
    np.testing.assert_array_equal(host(out), expected)
    assert np.isneginf(expected[0, 96:]).all() and np.isfinite(expected[1]).all()


def test_bad_arguments_are_refused():
    logits = dev(np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError, match="mask_rows"):
        apply_token_masks(logits, dev(np.zeros((1, 1), np.int32)), dev(np.zeros(3, np.int32)))
    with pytest.raises(ValueError, match="bits"):
        apply_token_masks(logits, dev(np.zeros((1, 1), np.int64)), dev(np.zeros(2, np.int32)))
