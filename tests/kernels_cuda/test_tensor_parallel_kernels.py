"""The tensor-parallel layout kernels (kernels/cuda/tensor_parallel): exact copies, so checked
against numpy indexing and the unsharded embedding's own bits. Cheap, so part of the smoke run
(make test's simulator phase checks that every kernel module is called)."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import dev, host, poisoned, random_blocks, random_weight
from vtllm.kernels import QType
from vtllm.kernels.cuda import embedding
from vtllm.kernels.cuda.tensor_parallel import embedding_shard, unshard_columns

pytestmark = [pytest.mark.cudasim, pytest.mark.smoke]


@pytest.mark.parametrize("qtype", [QType.BF16, QType.Q4_0], ids=lambda q: q.name)
def test_embedding_shard_gives_its_rows_and_zeros_elsewhere(rng, qtype):
    vocab, k, start, rows = 12, 32, 5, 4  # this rank holds ids 5..8
    quantized = qtype == QType.Q4_0
    full = random_blocks(rng, qtype, vocab, k) if quantized else random_weight(rng, qtype, vocab, k)
    shard = np.ascontiguousarray(full[start : start + rows])
    ids = np.array([5, 0, 8, 9, 4, 11, 6, -1], np.int32)  # both edges, padding -1
    out = poisoned((len(ids), k))
    embedding_shard(dev(ids), dev(shard), qtype, start, out)
    whole = poisoned((len(ids), k))
    embedding(dev(ids), dev(full), qtype, whole)  # the unsharded lookup's bits
    inside = (ids >= start) & (ids < start + rows)
    got, expected = host(out), host(whole)
    np.testing.assert_array_equal(got[inside], expected[inside])
    np.testing.assert_array_equal(got[~inside], 0.0)


@pytest.mark.parametrize("vocab", [12, 10], ids=["even", "padded"])
def test_unshard_columns_puts_each_ranks_columns_in_place(rng, vocab):
    world, rows, width = 3, 2, 4
    parts = rng.standard_normal((world, rows, width)).astype(np.float32)
    out = poisoned((rows, vocab))
    unshard_columns(dev(parts), out)
    expected = np.concatenate(list(parts), axis=1)[:, :vocab]
    np.testing.assert_array_equal(host(out), expected)


def test_bad_shapes_are_refused(rng):
    parts = dev(np.zeros((2, 3, 4), np.float32))
    for shape in ((3, 9), (3, 4), (2, 8)):  # too wide, a rank with no column, rows
        with pytest.raises(ValueError, match="does not take"):
            unshard_columns(parts, poisoned(shape))
    with pytest.raises(ValueError, match="rows"):
        embedding_shard(
            dev(np.zeros(3, np.int32)),
            dev(np.zeros((4, 8), np.float32)),
            QType.F32,
            0,
            poisoned((2, 8)),
        )
