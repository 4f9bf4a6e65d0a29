"""linear and embedding on the device for K-quant and Q5_0 / Q5_1 weights (_linear_kquant) vs
the float64 reference on exactly decoded weights (kernels/cpu/quant.dequantize, itself checked
against gguf's), on raw random blocks: every quant value, subnormal scales."""

import numpy as np
import pytest

from tests.kernels.kquant_blocks import random_kquant
from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from tests.kernels_cuda.test_linear import check_close
from vtllm.kernels import QType
from vtllm.kernels.cuda import embedding, linear
from vtllm.kernels.reference import embedding_ref

pytestmark = pytest.mark.cudasim

KQ = [QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K]
Q5 = [QType.Q5_0, QType.Q5_1]
# (N, K): N not a multiple of the warps per block; Q5 K = 96 leaves lanes without a block
SHAPES = {q: [(9, 512)] + ([] if SIMULATOR else [(4099, 4096)]) for q in KQ}
SHAPES.update({q: [(9, 96), (3, 288)] + ([] if SIMULATOR else [(1000, 4864)]) for q in Q5})


@pytest.mark.parametrize("qtype", KQ + Q5, ids=lambda q: q.name)
def test_matches_reference_and_rows_are_independent_of_m(rng, qtype):
    for i, (n, k) in enumerate(SHAPES[qtype]):
        w = random_kquant(rng, qtype, n, k)
        x = (rng.standard_normal((5, k)) * 2).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32) if i == 0 else None
        out = poisoned((5, n))
        linear(dev(x), dev(w), qtype, out, bias=None if bias is None else dev(bias))
        got = host(out)
        check_close(got, x, w, qtype, bias)
        one = poisoned((1, n))  # the same row alone: the bits of a decode step
        linear(dev(x[3:4]), dev(w), qtype, one, bias=None if bias is None else dev(bias))
        np.testing.assert_array_equal(host(one)[0], got[3])


@pytest.mark.skipif(SIMULATOR, reason="the simulator's arrays carry no device address")
@pytest.mark.parametrize("qtype", [QType.Q4_K, QType.Q6_K, QType.Q5_0], ids=lambda q: q.name)
def test_weight_off_a_16_byte_boundary_gives_the_same_bits(rng, qtype):
    """Rows carved from a flat buffer 2 bytes in: the chunks are read from aligned addresses
    and shifted into place, with the bits of the aligned weight."""
    n, k = 5, 512
    w = random_kquant(rng, qtype, n, k)
    x = rng.standard_normal((3, k)).astype(np.float32)
    flat = dev(np.concatenate([np.zeros(2, np.uint8), w.ravel()]))
    carved = flat[2:].reshape(w.shape)
    assert carved.__cuda_array_interface__["data"][0] % 16
    out, ref = poisoned((3, n)), poisoned((3, n))
    linear(dev(x), carved, qtype, out)
    linear(dev(x), dev(w), qtype, ref)
    np.testing.assert_array_equal(host(out), host(ref))
    check_close(host(out), x, w, qtype)


def test_col0_writes_its_columns_only(rng):
    """q, k and v of different storage types each fill their part of one qkv buffer."""
    k = 256
    parts = [(QType.Q4_K, 6), (QType.Q6_K, 3), (QType.Q5_0, 4)]
    x = rng.standard_normal((2, k)).astype(np.float32)
    total = sum(n for _, n in parts)
    bias = rng.standard_normal(total).astype(np.float32)
    out, col = poisoned((2, total + 1)), 0
    for qtype, n in parts:
        w = random_kquant(rng, qtype, n, k)
        full_bias = np.concatenate([bias, [0.0]]).astype(np.float32)
        linear(dev(x), dev(w), qtype, out, bias=dev(full_bias), col0=col)
        check_close(host(out)[:, col : col + n], x, w, qtype, bias[col : col + n])
        col += n
    assert np.isnan(host(out)[:, total]).all()
    with pytest.raises(ValueError, match="column"):
        linear(dev(x), dev(random_kquant(rng, QType.Q4_K, 4, k)), QType.Q4_K, out, col0=total - 2)
    with pytest.raises(ValueError, match="col0"):
        w = np.zeros((2, k), np.float32)
        linear(dev(x), dev(w), QType.F32, poisoned((2, 4)), col0=2)


@pytest.mark.parametrize("qtype", KQ + Q5, ids=lambda q: q.name)
def test_embedding_rows(rng, qtype):
    n, k = 7, 512 if qtype in KQ else 96
    w = random_kquant(rng, qtype, n, k)
    ids = np.array([3, -1, 0, 6], np.int32)
    out = poisoned((4, k))
    embedding(dev(ids), dev(w), qtype, out)
    got = host(out)
    assert np.isnan(got[1]).all()
    # d * q - m: a fused multiply-add on the GPU may round once instead of twice
    exact = qtype in (QType.Q3_K, QType.Q6_K, QType.Q5_0)
    ref = embedding_ref(ids[[0, 2, 3]], w, qtype)
    np.testing.assert_allclose(got[[0, 2, 3]], ref, rtol=0 if exact else 1e-6, atol=0)


def test_q8_k_is_refused(rng):
    w = random_kquant(rng, QType.Q8_K, 2, 256)
    with pytest.raises(ValueError, match="Q8_K"):
        linear(dev(np.zeros((1, 256), np.float32)), dev(w), QType.Q8_K, poisoned((1, 2)))
