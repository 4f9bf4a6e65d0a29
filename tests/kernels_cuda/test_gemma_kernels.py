"""Gemma's elementwise kernels on the device: GeGLU (gelu_tanh(gate) * up) and the logits'
soft-cap vs the float64 references, and the scaled embedding's F16 / BF16 rounding, bit for bit
as the CPU backend rounds on the host (executor/cpu_ops._round_to)."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import dev, host, poisoned
from vtllm.executor.cpu_ops import _round_to
from vtllm.kernels import QType
from vtllm.kernels.cuda.activation import gelu_tanh_and_mul, soft_cap, tile_interleave
from vtllm.kernels.cuda.embedding import embedding_scaled
from vtllm.kernels.reference import gelu_tanh_and_mul_ref, soft_cap_ref
from vtllm.models.synthetic import to_bf16_bits

pytestmark = pytest.mark.cudasim


@pytest.mark.parametrize("shape", [(3, 22), (2, 48)], ids=str)
def test_geglu_matches_reference_in_both_layouts(rng, shape):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    out = poisoned((shape[0], shape[1] // 2))
    gelu_tanh_and_mul(dev(x), out)
    np.testing.assert_allclose(host(out), gelu_tanh_and_mul_ref(x), rtol=5e-6, atol=1e-6)
    if shape[1] % 16 == 0:  # gate and up in runs of 8 (a packed gate/up matrix's order)
        tiled = poisoned(out.shape)
        gelu_tanh_and_mul(dev(tile_interleave(x, 8, axis=1)), tiled, tile=8)
        np.testing.assert_array_equal(host(tiled), host(out))


def test_soft_cap_matches_reference(rng):
    x = (rng.standard_normal((3, 40)) * 20).astype(np.float32)
    d = dev(x)
    soft_cap(d, 10.0)
    np.testing.assert_allclose(host(d), soft_cap_ref(x, 10.0), rtol=2e-6, atol=1e-6)
    with pytest.raises(ValueError, match="positive"):
        soft_cap(d, 0.0)


def _cpu_scaled(rows: np.ndarray, qtype: QType, factor: float) -> np.ndarray:
    """cpu_ops.embed_scaled's arithmetic on decoded rows."""
    scale = _round_to(np.array([factor], np.float32), qtype)
    return _round_to(rows * scale[0], qtype)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
@pytest.mark.parametrize("qtype", [QType.F16, QType.BF16, QType.F32], ids=lambda q: q.name)
def test_scaled_embedding_rounds_as_the_cpu_backend(rng, qtype):
    """Random rows plus the F16 edges: subnormal products, ties, values that overflow to inf."""
    vocab, hidden, factor = 6, 40, 48.0**0.5
    w = (rng.standard_normal((vocab, hidden)) * 0.3).astype(np.float32)
    w[0, :8] = [1e-6, -3e-7, 2.0**-20, 65504 / 6.9, 9500.0, -9600.0, 6e-8, 0.0]
    if qtype == QType.F16:
        stored, rows = w.astype(np.float16), w.astype(np.float16).astype(np.float32)
    elif qtype == QType.BF16:
        stored = to_bf16_bits(w)
        rows = (stored.astype(np.uint32) << 16).view(np.float32)
    else:
        stored, rows = w, w
    ids = np.array([0, 3, -1, 5], np.int32)
    out = poisoned((4, hidden))
    embedding_scaled(dev(ids), dev(stored), qtype, factor, out)
    got = host(out)
    want = _cpu_scaled(rows[ids[[0, 1, 3]]].copy(), qtype, factor)
    np.testing.assert_array_equal(got[[0, 1, 3]], want)
    assert np.isnan(got[2]).all(), "a padding row stays unwritten"
    if qtype == QType.F16:
        assert np.isinf(got[0, 4:6]).all() and (got[0, 0:3] != rows[0, 0:3] * factor).all()
