"""The routed experts on tensor cores (kernels/cuda/_moe_mma through moe.expert_linear): each
pair's row has the bits linear_mma gives that row of x with its expert's packed W, whatever
the step's size and whichever pairs share its tile; upload_experts packs bf16 experts and the
layer's linears run there. Under the simulator the mma is a float64 stand-in (kernels/cuda/
_ptx.py), so these tests check the packing, the gathering, the work split and the order of
the sums; on a GPU, the real mma."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned, random_weight
from tests.kernels_cuda.test_linear_mma import check_close, rounded_to_bf16
from vtllm.kernels import QType
from vtllm.kernels.cuda._linear_mma import UNROLL, WIDE_WARPS, linear_mma, pack_bf16
from vtllm.kernels.cuda._moe_mma import PAIRS_PER_TILE, pack_experts
from vtllm.kernels.cuda.moe import PairGroups, expert_linear, group_pairs, upload_experts

pytestmark = pytest.mark.cudasim

E, TOP_K = 4, 2
# (N, K): K tiles short of one round of the loop (padded tiles); on a card also a narrow W
# with a long K (wide blocks) and Qwen3-30B-A3B's gate/up and down
SHAPES = [(16, 48)] + ([] if SIMULATOR else [(32, 16 * (WIDE_WARPS * UNROLL + 3)),
                                             (1536, 2048), (2048, 768)])  # fmt: skip


def _ids(rng, t):
    """top-2 of E experts per token; expert 1 takes most pairs (tiles of several pairs)."""
    ids = np.empty((t, TOP_K), np.int32)
    for i in range(t):
        ids[i] = [1, rng.choice([0, 2, 3])] if i % 3 else rng.choice(E, TOP_K, replace=False)
    return ids


def _run(x, ids, w, *, col0=0, width=None):
    ids_dev = dev(ids)
    groups = PairGroups.create(ids.size, E)
    group_pairs(ids_dev, groups, per_tile=PAIRS_PER_TILE)
    out = poisoned((ids.size, width or w.n))
    expert_linear(dev(x), ids_dev, groups, w, QType.BF16, out, col0=col0)
    return host(out)


def _reference(x, ids, mats, x_bf16):
    """[pairs, N]: pair (t, r)'s row is linear_mma's for row t of x with expert ids[t, r]'s
    own packed W (each expert run over its tokens only: the simulator's time goes on mmas)."""
    want = np.full((ids.size, mats[0].shape[0]), np.nan, np.float32)
    for e, m in enumerate(mats):
        tokens, ranks = np.nonzero(ids == e)
        if len(tokens):
            out = poisoned((len(tokens), m.shape[0]))
            linear_mma(dev(x[tokens]), pack_bf16(dev(m), x_bf16=x_bf16), out)
            want[tokens * ids.shape[1] + ranks] = host(out)
    return want


# x_bf16 (one mma a tile) in the simulator, whose time goes on mmas: the hi + lo kernel runs
# there end to end (test_moe_forward_sim's float32 runner); both here on a card
@pytest.mark.parametrize("x_bf16", [True] + ([] if SIMULATOR else [False]))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_pairs_have_linear_mma_bits_at_any_step_size(rng, shape, x_bf16):
    """Gate/up's case (a row of x per token): 9 tokens, then 3 and 1 of them alone; each
    pair's row equals linear_mma's for its token and expert, bit for bit, at col0. Down's
    case (a row of x per pair, pair p reading row p) gives the same bits."""
    n, k = shape
    mats = [random_weight(rng, QType.BF16, n, k) for _ in range(E)]
    w = pack_experts(mats, x_bf16=x_bf16)
    x = (rng.standard_normal((9, k)) * 3).astype(np.float32)
    ids = _ids(rng, 9)
    got = _run(x, ids, w, col0=3, width=n + 5)
    assert np.isnan(got[:, :3]).all() and np.isnan(got[:, n + 3 :]).all()
    got = got[:, 3 : n + 3]
    np.testing.assert_array_equal(got, _reference(x, ids, mats, x_bf16))
    np.testing.assert_array_equal(_run(np.repeat(x, TOP_K, axis=0), ids, w), got)
    for rows in ([4], [0, 5, 8]):  # a decode step, a small batch: the same bits
        sub = _run(x[rows], ids[rows], w)
        want = np.concatenate([got[t * TOP_K : (t + 1) * TOP_K] for t in rows])
        np.testing.assert_array_equal(sub, want)
    check_close(got[0:1], rounded_to_bf16(x[0:1]) if x_bf16 else x[0:1], mats[ids[0, 0]])


@pytest.mark.smoke  # the cheaper case: _moe_mma's kernel, packing and grouping
def test_upload_takes_the_tensor_cores_for_bf16_experts(rng):
    """bf16 gate and up of 16-aligned sides: one packed part, tiles of eight pairs; the
    layer's gate/up gives linear_mma's bits for [gate; up] of each expert."""
    h, width = 16, 16
    gate = [random_weight(rng, QType.BF16, width, h) for _ in range(E)]
    up = [random_weight(rng, QType.BF16, width, h) for _ in range(E)]
    down = [random_weight(rng, QType.BF16, h, width) for _ in range(E)]
    experts = upload_experts(
        [
            [(g, QType.BF16, (width, h)), (u, QType.BF16, (width, h))]
            for g, u in zip(gate, up, strict=True)
        ],
        [(d, QType.BF16, (h, width)) for d in down],
        x_bf16=True,
        stream=0,
    )
    assert experts.pairs_per_tile == PAIRS_PER_TILE and experts.width == width
    x = rng.standard_normal((2, h)).astype(np.float32)
    ids = _ids(rng, 2)
    ids_dev, groups = dev(ids), PairGroups.create(ids.size, E)
    group_pairs(ids_dev, groups, per_tile=experts.pairs_per_tile)
    gu, act, ys = poisoned((4, 2 * width)), poisoned((4, width)), poisoned((4, h))
    experts.gated_up(dev(x), ids_dev, groups, gu, act)
    experts.down_proj(act, ids_dev, groups, ys)
    gate_up = [np.concatenate([g, u]) for g, u in zip(gate, up, strict=True)]
    np.testing.assert_array_equal(host(gu), _reference(x, ids, gate_up, True))
    assert not np.isnan(host(ys)).any()
    with pytest.raises(ValueError, match="tiles of 8"):
        group_pairs(ids_dev, groups)  # the GEMV's tiles of four
        experts.down_proj(act, ids_dev, groups, ys)
