"""embedding on the device vs the float64 reference, every QType; padding ids are skipped."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import (
    ALL_QTYPES,
    QUANTIZED,
    dev,
    host,
    poisoned,
    random_blocks,
    random_weight,
)
from vtllm.kernels import QType
from vtllm.kernels.cuda import embedding
from vtllm.kernels.reference import embedding_ref

pytestmark = pytest.mark.cudasim


@pytest.mark.parametrize("qtype", ALL_QTYPES, ids=lambda q: q.name)
def test_matches_reference(rng, qtype):
    n, k = 11, 64
    w = random_blocks(rng, qtype, n, k) if qtype in QUANTIZED else random_weight(rng, qtype, n, k)
    ids = rng.integers(0, n, 5).astype(np.int32)
    ids[2] = -1  # padding row: left unwritten
    out = poisoned((5, k))
    embedding(dev(ids), dev(w), qtype, out)
    got = host(out)
    assert np.isnan(got[2]).all()
    keep = ids >= 0
    ref = embedding_ref(ids[keep], w, qtype)
    # Q4_1 is d*q + m: a fused multiply-add on the GPU may round once instead of twice
    np.testing.assert_allclose(got[keep], ref, rtol=1e-6 if qtype == QType.Q4_1 else 0, atol=0)


def test_rejects_host_arrays_and_bad_shapes(rng):
    w = random_weight(rng, QType.F32, 4, 8)
    ids = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match="device array"):
        embedding(ids, dev(w), QType.F32, poisoned((2, 8)))
    with pytest.raises(ValueError, match="float32"):
        embedding(dev(ids), dev(w), QType.F16, poisoned((2, 8)))
    with pytest.raises(ValueError, match="rows"):
        embedding(dev(ids), dev(w), QType.F32, poisoned((3, 8)))
