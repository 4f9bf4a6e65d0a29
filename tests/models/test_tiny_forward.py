"""Whole-model logits of tiny random checkpoints against an independent float64 forward."""

import numpy as np
import pytest

from tests.models.reference_forward import reference_logits
from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm.models.loader import load_model
from vtllm.models.synthetic import write_checkpoint

SHAPES = ["tiny", "tiny-qwen3", "tiny-qwen2"]


@pytest.fixture(scope="module", params=SHAPES)
def tiny(request, tmp_path_factory):
    directory = write_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=3)
    return directory, load_model(directory)


def _ids(n, vocab, seed=0):
    return np.random.default_rng(seed).integers(3, vocab, n).tolist()


def test_logits_match_reference(tiny):
    directory, loaded = tiny
    ids = _ids(40, loaded.config.vocab_size)
    ours = teacher_forced_logits(make_runner(loaded), ids, [40])
    ref = reference_logits(directory, ids)
    scale = np.abs(ref).max(axis=1, keepdims=True)
    assert np.max(np.abs(ours - ref) / scale) < 1e-4
    assert (ours.argmax(1) == ref.argmax(1)).mean() > 0.97


def test_chunking_is_bitwise_invisible(tiny):
    _, loaded = tiny
    ids = _ids(40, loaded.config.vocab_size, seed=1)
    runner = make_runner(loaded)
    whole = teacher_forced_logits(runner, ids, [40])
    chunked = teacher_forced_logits(runner, ids, [7, 7, 7, 7, 7, 5])
    one_by_one = teacher_forced_logits(runner, ids, [1] * 40)
    assert np.array_equal(whole, chunked)
    assert np.array_equal(whole, one_by_one)
