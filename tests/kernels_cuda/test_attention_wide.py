"""Heads of 256 dims (Gemma 2 / 3) through the exact family's wide variants (the split, ring and
prefill kernels): the float64 reference and the same bits on every path, plain and with a window
and a cap, both cache types. A decode row over two splits and a prompt chunk across the split
edge; on a card the model shapes of test_window_attention too."""

import pytest

from tests.kernels_cuda.test_window_attention import check_every_path
from vtllm.kernels.cuda.attention import fuses_rope, supports

pytestmark = pytest.mark.cudasim

SEQS = [(1, 40), (3, 35), (0, 0)]


@pytest.mark.parametrize(
    ("window", "cap", "kv"), [(0, 0.0, "bfloat16"), (6, 1.5, "float32")], ids=str
)
def test_every_path_matches_the_reference_with_the_same_bits(rng, window, cap, kv, monkeypatch):
    """window 6: the decode row's first split is empty; the chunk's rows start inside the
    first split."""
    check_every_path(rng, 2, 1, 256, 8, SEQS, kv, window, cap, monkeypatch)


def test_which_heads_the_family_takes():
    assert supports(8, 4, 256) and supports(8, 4, 128) and supports(2, 1, 20)
    assert not supports(8, 4, 192) and not supports(8, 4, 512) and not supports(16, 1, 128)
    assert not fuses_rope(8, 4, 256)  # one-token steps: qkv_rope, then the split kernel
