"""embedding vs the reference, in every weight format; rows do not depend on the batch."""

import numpy as np
import pytest

from vtllm.kernels import PER_TYPE, QType
from vtllm.kernels.cpu.embedding import embedding
from vtllm.kernels.cpu.linear import linear
from vtllm.kernels.cpu.quant import quantize
from vtllm.kernels.reference import embedding_ref


def run(ids, w, qtype, k):
    out = np.full((len(ids), k), np.nan, np.float32)
    embedding(np.asarray(ids, np.int32), w, qtype, out)
    return out


@pytest.mark.parametrize("qtype", [q for q in QType if q not in PER_TYPE], ids=lambda q: q.name)
def test_matches_reference(rng, qtype):
    k = 96 if qtype in (QType.Q4_0, QType.Q4_1, QType.Q8_0) else 72
    w = quantize(rng.standard_normal((50, k)).astype(np.float32), qtype)
    ids = rng.integers(0, 50, 37).astype(np.int32)
    ids[:2] = [0, 49]
    out = run(ids, w, qtype, k)
    assert np.array_equal(out, embedding_ref(ids, w, qtype).astype(np.float32))  # exact decode


@pytest.mark.parametrize("qtype", [QType.Q4_1, QType.Q8_0, QType.BF16], ids=lambda q: q.name)
def test_batch_invariance_and_tied_head(rng, threads, qtype):
    """Rows alone equal rows in a batch; the decoded rows are the floats linear multiplies by
    (a one-hot x through linear picks out exactly the embedding row)."""
    w = quantize(rng.standard_normal((40, 64)).astype(np.float32), qtype)
    ids = rng.integers(0, 40, 37).astype(np.int32)
    with threads(2):
        batch = run(ids, w, qtype, 64)
    with threads(1):
        for t in (0, 17, 36):
            assert np.array_equal(run(ids[t : t + 1], w, qtype, 64)[0], batch[t])
    out = np.empty((64, 40), np.float32)
    linear(np.eye(64, dtype=np.float32), w, qtype, out)  # column n = W[n] via x = e_k
    assert np.array_equal(out.T[ids], batch)


def test_bad_inputs(rng):
    w = quantize(rng.standard_normal((10, 64)).astype(np.float32), QType.Q8_0)
    out = np.empty((2, 64), np.float32)
    for ids, ww, q, o in [
        (np.array([0, 10], np.int32), w, QType.Q8_0, out),
        (np.array([-1, 0], np.int32), w, QType.Q8_0, out),
        (np.array([0, 1], np.int64), w, QType.Q8_0, out),
        (np.array([0, 1], np.int32), w, QType.Q4_0, out),
        (np.array([0, 1], np.int32), w, QType.Q8_0, np.empty((3, 64), np.float32)),
        (np.array([0, 1], np.int32), w, QType.Q8_0, np.empty((2, 64), np.float64)),
        (np.array([0, 1], np.int32), w, QType.Q8_0, np.empty((2, 32), np.float32)),
    ]:
        with pytest.raises(ValueError):
            embedding(ids, ww, q, o)


def test_read_only_inputs(rng):
    w = quantize(rng.standard_normal((10, 64)).astype(np.float32), QType.Q4_0)
    ids = np.array([3, 1], np.int32)
    want = run(ids, w, QType.Q4_0, 64)
    w.flags.writeable = ids.flags.writeable = False
    assert np.array_equal(run(ids, w, QType.Q4_0, 64), want)
