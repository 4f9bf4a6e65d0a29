"""Tensor-parallel sharding of the default model (models/sharding), in one process: what each
rank keeps, that column-parallel rows are TP=1's bits, and the one-line refusals."""

import msgspec
import numpy as np
import pytest

from vtllm.errors import UnsupportedModel
from vtllm.kernels import cpu
from vtllm.models.config import ModelConfig
from vtllm.models.sharding import check_shardable, even_ranges, shard_plan, shard_weights


def _linear(x, w):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    cpu.linear(x, w.data, w.qtype, out)
    return out


def test_even_ranges_cover_in_whole_units():
    assert even_ranges(9, 2) == [range(0, 5), range(5, 9)]
    assert even_ranges(1536, 2, 256) == [range(0, 768), range(768, 1536)]
    assert even_ranges(1280, 2, 256) == [range(0, 768), range(768, 1280)]


def test_heads_split_by_whole_gqa_groups_or_replicate_kv():
    c = msgspec.structs.replace
    # 9 q heads, 3 kv heads: SmolLM2-135M's; a vocab that two ranks split unevenly
    base = ModelConfig(
        architecture="llama",
        hidden_size=576,
        num_layers=1,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=49153,
        rms_norm_eps=1e-5,
        rope_theta=1e4,
    )
    p0, p1 = shard_plan(base, 0, 2), shard_plan(base, 1, 2)
    assert (p0.q_heads, p0.kv_heads, p1.q_heads, p1.kv_heads) == (
        range(0, 6),
        range(0, 2),
        range(6, 9),
        range(2, 3),
    )
    assert (p0.vocab_rows, p1.vocab_rows, p1.vocab_padded) == (24577, 24576, 24577)
    mqa = c(base, num_heads=8, num_kv_heads=2)
    plans = [shard_plan(mqa, r, 4) for r in range(4)]
    assert [p.kv_heads for p in plans] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]
    assert [p.q_heads for p in plans] == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    for bad, message in (
        (c(base, num_kv_heads=3), "replicated"),  # 3 kv heads over 4 ranks
        (c(base, architecture="gemma2"), "not supported"),
        (c(base, architecture="phi3"), "not supported"),
        (c(base, num_experts=8, num_experts_per_tok=2), "not supported"),
    ):
        with pytest.raises(UnsupportedModel, match=message) as info:
            check_shardable(bad, 4)
        assert "\n" not in str(info.value)


def test_column_parallel_rows_are_tp1_bits_and_row_parallel_parts_sum(default_model):
    config, weights = default_model.config, default_model.weights
    shards = [shard_weights(config, weights, r, 2) for r in range(2)]
    assert [s.config.num_heads for s in shards] == [6, 3]
    assert [s.config.intermediate_size for s in shards] == [768, 768]
    x = np.random.default_rng(0).standard_normal((5, config.hidden_size)).astype(np.float32)
    full, layer = weights.layers[0], [s.weights.layers[0] for s in shards]
    # gate_up: each rank's gate and up rows are its slice of the full product, to the bit
    gu = _linear(x, full.gate_up[0])
    inter = config.intermediate_size
    for s, lw in zip(shards, layer, strict=True):
        cols = s.plan.intermediate
        part = _linear(x, lw.gate_up[0])
        np.testing.assert_array_equal(part[:, : len(cols)], gu[:, cols.start : cols.stop])
        np.testing.assert_array_equal(
            part[:, len(cols) :], gu[:, inter + cols.start : inter + cols.stop]
        )
    # down: the ranks' partial products sum to the full one (in another order: to rounding)
    act = np.random.default_rng(1).standard_normal((5, inter)).astype(np.float32)
    parts = [
        _linear(
            np.ascontiguousarray(act[:, s.plan.intermediate.start : s.plan.intermediate.stop]),
            lw.down,
        )
        for s, lw in zip(shards, layer, strict=True)
    ]
    np.testing.assert_allclose(parts[0] + parts[1], _linear(act, full.down), rtol=1e-4, atol=1e-4)
    # the vocab shards' logits side by side are the full logits
    h = x[:2]
    logits = np.concatenate([_linear(h, s.weights.lm_head) for s in shards], axis=1)
    np.testing.assert_array_equal(logits[:, : config.vocab_size], _linear(h, weights.lm_head))


@pytest.mark.parametrize("shape", ["tiny-qwen2", "tiny-qwen3"])
def test_two_ranks_in_threads_give_tp1_logits(tmp_path, shape):
    """The whole sharded forward (qkv bias, q/k norm) over two ranks in two threads of this
    process (numba lets go of the GIL), teacher-forced against one rank: logits within float32
    rounding, the same argmax, and the same bits on both ranks."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.models.runner_util import make_runner, teacher_forced_logits
    from vtllm.executor.communicator import ShmCommunicator, create_shm_group, remove_shm_group
    from vtllm.executor.kv_cache import allocate_kv_cache
    from vtllm.executor.tp_worker import make_runner as make_shard_runner
    from vtllm.models.loader import load_model
    from vtllm.models.synthetic import write_checkpoint

    loaded = load_model(write_checkpoint(tmp_path, shape, seed=3))
    ids = list(np.random.default_rng(4).integers(3, 500, 12))
    expected = teacher_forced_logits(make_runner(loaded), ids, [7, 5])

    group = create_shm_group(2, timeout=60.0)  # its pipes serve threads as well as processes

    def rank(r):
        shard = shard_weights(loaded.config, loaded.weights, r, 2)
        comm = ShmCommunicator(group, r)
        kv = allocate_kv_cache(shard.config, 64, 4)
        runner = make_shard_runner(
            loaded.config, shard, comm, cpu, kv, max_num_seqs=4, max_model_len=256
        )
        return teacher_forced_logits(runner, ids, [7, 5])

    try:
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(rank, range(2)))
    finally:
        remove_shm_group(group)
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_allclose(got[0], expected, rtol=1e-4, atol=1e-4)
    assert (got[0].argmax(1) == expected.argmax(1)).all()
