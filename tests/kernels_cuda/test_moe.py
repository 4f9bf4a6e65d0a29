"""The MoE kernels (kernels/cuda/moe) against the numpy float64 references: the router's top-k
(ties, a cut through a tie, a NaN row), the expert-indexed GEMV in every storage type the
dense GEMVs decode, gate/up of two types, and the combine."""

import numpy as np
import pytest

from tests.kernels.kquant_blocks import random_kquant
from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned, random_weight
from tests.kernels_cuda.test_linear import check_close
from vtllm.kernels import QType, reference
from vtllm.kernels.cpu import moe as cpu_moe
from vtllm.kernels.cuda import _moe_gemv
from vtllm.kernels.cuda.moe import (
    PairGroups,
    combine,
    expert_linear,
    group_pairs,
    route_top_k,
    upload_experts,
)

pytestmark = pytest.mark.cudasim

KQUANT = {QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K, QType.Q5_0, QType.Q5_1}
# qtype: K. Float K a multiple of 4 takes the 64-bit word kernel, 34 the one-weight kernel.
CASES = {
    QType.F32: 64, QType.F16: 34, QType.BF16: 64, QType.Q4_0: 64, QType.Q4_1: 64,
    QType.Q8_0: 64, QType.Q2_K: 256, QType.Q3_K: 256, QType.Q4_K: 256, QType.Q5_K: 256,
    QType.Q6_K: 256, QType.Q5_0: 64, QType.Q5_1: 96,
}  # fmt: skip
E, N = 3, 5  # experts; rows per expert (not a multiple of the warps per block)


def _linear(x, ids, w, qtype, out, *, col0=0):
    """expert_linear over ids grouped on the device (host arrays x, ids)."""
    ids = dev(ids)
    groups = PairGroups.create(ids.shape[0] * ids.shape[1], E)
    group_pairs(ids, groups)
    expert_linear(dev(x), ids, groups, w, qtype, out, col0=col0)
    return groups


def _weights(rng, qtype, n, k):
    if qtype in KQUANT:
        return random_kquant(rng, qtype, n, k)
    return random_weight(rng, qtype, n, k)


@pytest.mark.parametrize("renormalize", [False, True])
def test_route_matches_reference_with_ties(rng, renormalize):
    t, e, k = 6, 8, 3
    logits = rng.standard_normal((t, e)).astype(np.float32) * 2
    logits[0] = [0.5, 2.0, 1.0, 2.0, 0.0, 2.0, -1.0, 1.0]  # a three-way tie at the top
    logits[1] = [1.0, 0.0, 1.5, 1.5, 1.5, 0.0, 0.0, 0.0]  # k cuts through a tie
    ids, weights = poisoned((t, k), np.int32), poisoned((t, k))
    route_top_k(dev(logits), renormalize, ids, weights)
    want_ids, want_w = reference.route_top_k_ref(logits, k, renormalize)
    assert np.array_equal(host(ids), want_ids)
    assert host(ids)[0].tolist() == [1, 3, 5] and host(ids)[1].tolist() == [2, 3, 4]
    np.testing.assert_allclose(host(weights), want_w, rtol=1e-6, atol=0)
    cpu_ids, cpu_w = np.empty((t, k), np.int32), np.empty((t, k), np.float32)
    cpu_moe.route_top_k(logits, renormalize, cpu_ids, cpu_w)  # the CPU backend's semantics
    assert np.array_equal(host(ids), cpu_ids)
    np.testing.assert_allclose(host(weights), cpu_w, rtol=2e-7, atol=0)


def test_route_of_a_nan_row_stays_among_the_experts():
    """A padded row of a graph step may hold anything: its ids must still be experts."""
    logits = np.full((2, 4), np.nan, np.float32)
    logits[1] = [0.0, 1.0, 2.0, 3.0]
    ids, weights = poisoned((2, 2), np.int32), poisoned((2, 2))
    route_top_k(dev(logits), True, ids, weights)
    assert host(ids).tolist() == [[0, 1], [3, 2]]
    with pytest.raises(ValueError, match="ids"):
        route_top_k(dev(logits), True, poisoned((2, 5), np.int32), poisoned((2, 5)))


# Under the simulator the K-quants of Q4_K_M files only (Q4_K, Q6_K: ~15-20 s each); every
# K-quant's lane units have cases of their own in test_linear_kquant; the card runs them all.
EXPERT_TYPES = [q for q in CASES if not (SIMULATOR and q in (QType.Q2_K, QType.Q3_K, QType.Q5_K))]


@pytest.mark.parametrize("qtype", EXPERT_TYPES, ids=lambda q: q.name)
def test_expert_linear_matches_reference(rng, qtype):
    """Each pair against its expert's matrix; a token alone gives the bits it gets beside
    others (the decode step's bits); pairs that read their own rows of x (the down case)."""
    k = CASES[qtype]
    mats = [_weights(rng, qtype, N, k) for _ in range(E)]
    w = dev(np.concatenate(mats))
    x = rng.standard_normal((3, k)).astype(np.float32)
    ids = np.array([[2, 0], [1, 2], [0, 1]], np.int32)
    out = poisoned((6, N + 2))
    _linear(x, ids, w, qtype, out, col0=1)
    got = host(out)
    assert np.isnan(got[:, 0]).all() and np.isnan(got[:, N + 1]).all()
    for p in range(6):
        t, r = divmod(p, 2)
        check_close(got[p : p + 1, 1 : N + 1], x[t : t + 1], mats[ids[t, r]], qtype)
    alone = poisoned((2, N))
    _linear(x[1:2], ids[1:2], w, qtype, alone)
    np.testing.assert_array_equal(host(alone), got[2:4, 1 : N + 1])
    per_pair = poisoned((6, N))  # x with one row per pair: row p is pair p's
    xs = np.repeat(x, 2, axis=0)
    _linear(xs, ids, w, qtype, per_pair)
    np.testing.assert_array_equal(host(per_pair), got[:, 1 : N + 1])


def test_grouping_and_tiles_leave_every_pairs_bits(rng, monkeypatch):
    """Seven pairs on expert 0 (tiles of 4 and 3), three on 1, none on 2: the groups are the
    pairs sorted by expert, and each pair has the bits it gets alone; with the grid cut to 2
    block rows, blocks loop over the tiles (65535 on a card) to the same bits."""
    mats = [_weights(rng, QType.BF16, N, 64) for _ in range(E)]
    w = dev(np.concatenate(mats))
    x = rng.standard_normal((5, 64)).astype(np.float32)
    ids = np.array([[0, 1], [0, 1], [0, 0], [0, 0], [0, 1]], np.int32)  # an expert twice
    whole = poisoned((10, N))
    groups = _linear(x, ids, w, QType.BF16, whole)
    starts = host(groups.expert_start), host(groups.tile_start)
    assert starts[0].tolist() == [0, 7, 10, 10] and starts[1].tolist() == [0, 2, 3, 3]
    order = host(groups.order)
    assert sorted(order[:7]) == [0, 2, 4, 5, 6, 7, 8] and sorted(order[7:]) == [1, 3, 9]
    got = host(whole)
    for t in range(5):
        alone = poisoned((2, N))
        _linear(x[t : t + 1], ids[t : t + 1], w, QType.BF16, alone)
        np.testing.assert_array_equal(host(alone), got[2 * t : 2 * t + 2])
        for r in range(2):
            check_close(got[2 * t + r : 2 * t + r + 1], x[t : t + 1], mats[ids[t, r]], QType.BF16)
    monkeypatch.setattr(_moe_gemv, "MAX_GRID_Y", 2)
    looped = poisoned((10, N))
    _linear(x, ids, w, QType.BF16, looped)
    np.testing.assert_array_equal(host(looped), got)


def test_gate_up_of_two_types_and_the_combine(rng):
    """Gate Q5_0 beside up Q8_0 (a GGUF mix): two stacked parts writing their halves; then
    silu * up, down (BF16), and the combine, against float64 end to end."""
    h, width, k = 64, 8, 2
    gate = [random_kquant(rng, QType.Q5_0, width, h) for _ in range(E)]
    up = [random_weight(rng, QType.Q8_0, width, h) for _ in range(E)]
    down = [random_weight(rng, QType.BF16, h, width) for _ in range(E)]
    experts = upload_experts(
        [
            [(g, QType.Q5_0, (width, h)), (u, QType.Q8_0, (width, h))]
            for g, u in zip(gate, up, strict=True)
        ],
        [(d, QType.BF16, (h, width)) for d in down],
        stream=0,
    )
    assert len(experts.gate_up) == 2 and experts.width == width
    x = (rng.standard_normal((2, h)) * 1e-3).astype(np.float32)  # gates of a few units
    ids = np.array([[1, 2], [2, 0]], np.int32)
    weights = np.array([[0.7, 0.3], [0.6, 0.4]], np.float32)
    gu, act, ys = poisoned((4, 2 * width)), poisoned((4, width)), poisoned((4, h))
    ids_dev, groups = dev(ids), PairGroups.create(4, E)
    group_pairs(ids_dev, groups)
    experts.gated_up(dev(x), ids_dev, groups, gu, act)
    experts.down_proj(act, ids_dev, groups, ys)
    residual = rng.standard_normal((2, h)).astype(np.float32)
    out, acc = poisoned((2, h)), dev(residual)
    combine(ys, dev(weights), out)
    combine(ys, dev(weights), acc, accumulate=True)
    want = np.zeros((2, h))
    for t in range(2):
        for r in range(k):
            e = ids[t, r]
            g = reference.linear_ref(x[t : t + 1], gate[e], QType.Q5_0)
            u = reference.linear_ref(x[t : t + 1], up[e], QType.Q8_0)
            a = g / (1 + np.exp(-g)) * u
            want[t] += weights[t, r] * reference.linear_ref(a, down[e], QType.BF16)[0]
    np.testing.assert_allclose(host(out), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # accumulate: the bits of residual + the written sum (the pending add of an unfolded step)
    np.testing.assert_array_equal(host(acc), residual + host(out))
    ref = reference.combine_ref(host(ys), np.arange(4), weights)
    np.testing.assert_allclose(host(out), ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())


def test_bad_arguments_are_refused(rng):
    x, ids = dev(np.zeros((2, 64), np.float32)), dev(np.zeros((2, 2), np.int32))
    groups = PairGroups.create(4, 3)
    w = dev(random_weight(rng, QType.F32, 6, 64))
    with pytest.raises(ValueError, match="experts"):
        expert_linear(x, ids, PairGroups.create(4, 4), w, QType.F32, poisoned((4, 3)))
    with pytest.raises(ValueError, match="cannot take"):
        expert_linear(x, ids, groups, w, QType.F32, poisoned((4, 1)))
    with pytest.raises(ValueError, match="x"):
        x3 = dev(np.zeros((3, 64), np.float32))
        expert_linear(x3, ids, groups, w, QType.F32, poisoned((4, 2)))
    with pytest.raises(ValueError, match="more pairs"):
        group_pairs(dev(np.zeros((3, 2), np.int32)), groups)
    with pytest.raises(ValueError, match="ys"):
        combine(poisoned((3, 4)), dev(np.ones((2, 2), np.float32)), poisoned((2, 4)))
