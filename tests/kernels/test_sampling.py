"""Sampler kernel vs the float64 reference, plus the batch-invariance law, bit for bit.

Logits sit on a 1/32 grid: ties are exact (both sides break them by id) and every probability
boundary is far from float noise, so token ids must match the reference exactly."""

import numba
import numpy as np
import pytest

from vtllm.kernels.cpu.sampling import prompt_logprobs, sample
from vtllm.kernels.sampling_reference import prompt_logprobs_ref, sample_ref, uniform
from vtllm.kernels.sampling_table import LogprobsOut, SamplingTable

V, SLOTS, MAX_LEN = 4096, 64, 1536
DEFAULTS = dict(
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    seed=7,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    repetition_penalty=1.0,
    min_tokens=0,
    num_logprobs=None,
    prompt_len=0,
    logit_bias=None,
    min_stop_ids=[],
)


def grid_logits(rng, rows, vocab=V, scale=4.0):
    return (np.round(rng.standard_normal((rows, vocab)) * scale * 32) / 32).astype(np.float32)


class Case:
    """A table, a mirror with random history, and one row per slot at position hist_len."""

    def __init__(self, rng, settings, hist_len=200, prompt_len=120):
        self.table = SamplingTable.create(SLOTS)
        self.token_ids = rng.integers(0, V, (SLOTS, MAX_LEN)).astype(np.int32)
        self.num_tokens = np.full(SLOTS, hist_len, np.int32)
        for slot, overrides in enumerate(settings):
            kw = {**DEFAULTS, "seed": 1000 + slot, "prompt_len": prompt_len, **overrides}
            self.table.set_slot(slot, **kw)
        n = len(settings)
        self.slots = np.arange(n, dtype=np.int32)
        self.positions = np.full(n, hist_len, np.int32)
        self.logits = grid_logits(rng, n)

    def run(self, slots=None, positions=None, logits=None):
        slots = self.slots if slots is None else slots
        positions = self.positions if positions is None else positions
        logits = self.logits if logits is None else logits
        ids, num = self.token_ids.copy(), self.num_tokens.copy()
        out, lp = np.empty(len(slots), np.int32), LogprobsOut.create(len(slots))
        sample(logits, slots, positions, self.table, ids, num, out, out_logprobs=lp)
        return out, lp, ids, num

    def check(self):
        out, lp, ids, num = self.run()
        ref_ids, ref_num = self.token_ids.copy(), self.num_tokens.copy()
        ref, ref_lp = sample_ref(
            self.logits, self.slots, self.positions, self.table, ref_ids, ref_num
        )
        np.testing.assert_array_equal(out, ref)
        np.testing.assert_array_equal(ids, ref_ids)
        np.testing.assert_array_equal(num, ref_num)
        for b, row in enumerate(ref_lp):
            if row is not None:
                logprob, rank, top_ids, top_lps = row
                assert lp.rank[b] == rank
                np.testing.assert_allclose(lp.logprob[b], logprob, atol=2e-6, rtol=1e-6)
                np.testing.assert_array_equal(lp.top_ids[b, : len(top_ids)], top_ids)
                np.testing.assert_allclose(lp.top_logprobs[b, : len(top_ids)], top_lps, atol=2e-6)
                assert (lp.top_ids[b, len(top_ids) :] == -1).all()
        return out


def spread(**kw):
    """Eight rows of one setting at different temperatures (and so seeds, one per slot)."""
    return [dict(kw, temperature=t) for t in (0.3, 0.6, 0.8, 1.0, 1.0, 1.2, 1.5, 2.0)]


@pytest.mark.parametrize(
    "settings",
    [
        [dict(temperature=0.0)] * 6,
        spread(),
        spread(top_k=1) + spread(top_k=5) + spread(top_k=50),
        spread(top_p=0.1) + spread(top_p=0.5) + spread(top_p=0.9),
        spread(min_p=0.05) + spread(min_p=0.3),
        spread(top_k=50, top_p=0.8, min_p=0.02) + spread(top_k=3000, top_p=0.95),
        spread(repetition_penalty=1.3) + spread(repetition_penalty=0.7),
        spread(frequency_penalty=0.5)
        + spread(presence_penalty=-1.5)
        + spread(top_p=0.7, frequency_penalty=-0.4, presence_penalty=1.0, repetition_penalty=1.2),
        [dict(temperature=0.0, repetition_penalty=2.0, frequency_penalty=1.0)] * 4,
        spread(logit_bias={i: float(i % 7) - 3.0 for i in range(0, V, 17)}, num_logprobs=5),
        spread(num_logprobs=0) + spread(num_logprobs=20, top_k=40) + [dict(num_logprobs=None)],
    ],
    ids=[
        "greedy",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "combined",
        "repetition",
        "freq_presence",
        "greedy_penalties",
        "logit_bias",
        "logprobs",
    ],
)
def test_matches_reference(settings):
    rng = np.random.default_rng(len(settings) * 31 + len(str(settings)))
    case = Case(rng, settings)
    # Concentrate part of the history on likely tokens, so penalties change decisions.
    top = np.argsort(-case.logits, axis=1)[:, :40]
    case.token_ids[case.slots, 100:200] = top[:, rng.integers(0, 40, 100)]
    case.check()


def test_random_settings_match_reference():
    rng = np.random.default_rng(11)

    def pick(*options):
        return options[rng.integers(len(options))]

    rows = [
        dict(
            temperature=pick(0.0, 0.5, 1.0, 1.3),
            top_k=pick(0, 0, 1, 20, 700),
            top_p=pick(1.0, 1.0, 0.3, 0.95),
            min_p=pick(0.0, 0.0, 0.1),
            repetition_penalty=pick(1.0, 1.1, 0.9),
            frequency_penalty=pick(0.0, 0.3),
            presence_penalty=pick(0.0, -0.6),
            num_logprobs=pick(None, 0, 7),
            logit_bias=pick(None, {int(i): 2.5 for i in rng.integers(0, V, 30)}),
            min_tokens=pick(0, 500),
            min_stop_ids=[int(i) for i in rng.integers(0, V, 10)],
        )
        for _ in range(SLOTS)
    ]
    case = Case(rng, rows)
    case.positions = rng.integers(130, MAX_LEN, SLOTS).astype(np.int32)
    case.check()


def test_greedy_ties_and_penalty_effect():
    case = Case(np.random.default_rng(1), [dict(temperature=0.0)] * 2)
    case.logits[:, [30, 9, 700]] = case.logits.max() + 1.0
    assert case.check().tolist() == [9, 9]
    case.table.set_slot(1, **{**DEFAULTS, "temperature": 0.0, "repetition_penalty": 5.0})
    case.token_ids[1, 150] = 9  # an output token now: penalized, so the tie moves to id 30
    assert case.check().tolist() == [9, 30]


def test_logit_bias_forces_token():
    case = Case(np.random.default_rng(2), spread(logit_bias={1234: 100.0}) * 4)
    assert (case.check() == 1234).all()


def test_min_tokens_masks_stop_ids_until_reached():
    stops = [5, 77, 4000]
    rows = [dict(min_tokens=80 + i % 2, min_stop_ids=stops, temperature=1.5) for i in range(32)]
    case = Case(np.random.default_rng(3), rows, hist_len=200, prompt_len=120)
    case.logits[:, stops] = case.logits.max() + 15.0  # the stop ids would win every draw
    out = case.check()
    masked = np.arange(32) % 2 == 1  # 80 outputs so far: min_tokens 81 masks, 80 does not
    assert not np.isin(out[masked], stops).any()
    assert np.isin(out[~masked], stops).all()


@pytest.mark.parametrize("top_k", [0, 4])  # id-order walk, and the filtered (sorted) walk
def test_seeded_draws_follow_the_distribution(top_k):
    rng = np.random.default_rng(4)
    table = SamplingTable.create(SLOTS)
    for slot in range(SLOTS):
        table.set_slot(slot, **{**DEFAULTS, "seed": 99, "top_k": top_k})
    row = np.full(V, -40.0, np.float32)
    row[[3, 50, 51, 900, 2000, 4095]] = [2.0, 1.5, 1.0, 0.0, -0.5, 0.5]
    p = np.exp(row.astype(np.float64) - row.max())
    if top_k:
        p[np.argsort(-p, kind="stable")[top_k:]] = 0.0
    p /= p.sum()
    counts = np.zeros(V)
    token_ids, num = np.zeros((SLOTS, 2100), np.int32), np.zeros(SLOTS, np.int32)
    for start in range(0, 2000, 50):
        positions = np.arange(start, start + 50, dtype=np.int32)
        slots = rng.permutation(SLOTS)[:50].astype(np.int32)
        out = np.empty(50, np.int32)
        sample(np.tile(row, (50, 1)), slots, positions, table, token_ids, num, out)
        again = np.empty(50, np.int32)  # same seed and positions, other slots and order
        perm = rng.permutation(50)
        sample(
            np.tile(row, (50, 1)), slots[::-1].copy(), positions[perm], table, token_ids, num, again
        )
        np.testing.assert_array_equal(again, out[perm])
        np.add.at(counts, out, 1)
    keep = p > 1e-6
    assert counts[~keep].sum() == 0
    chi2 = ((counts[keep] - 2000 * p[keep]) ** 2 / (2000 * p[keep])).sum()
    assert chi2 < 30.0  # at most 5 degrees of freedom: p < 1e-5 for a correct sampler
    us = np.array([uniform(99, i) for i in range(2000)])
    assert abs(us.mean() - 0.5) < 0.03 and us.min() >= 0.0 and us.max() < 1.0


@pytest.mark.parametrize("threads", [1, 2])
def test_batch_invariance_bitwise(threads):
    rows = [
        dict(temperature=0.0),
        dict(),
        dict(top_k=50),
        dict(top_p=0.9),
        dict(min_p=0.1),
        dict(top_k=20, top_p=0.5, num_logprobs=3),
        dict(repetition_penalty=1.4),
        dict(frequency_penalty=0.8, presence_penalty=0.5, num_logprobs=20),
        dict(logit_bias={7: 5.0, 8: -5.0}),
        dict(min_tokens=500, min_stop_ids=[1, 2]),
        dict(temperature=0.5, num_logprobs=0),
        dict(temperature=1.8, top_p=0.99),
    ]
    rows += [dict(top_k=k, num_logprobs=1) for k in (2, 100, 1000, 5000, 10)]
    case = Case(np.random.default_rng(5), rows)
    case.positions = (200 + np.arange(17) * 37).astype(np.int32)
    alone = [
        case.run(case.slots[b : b + 1], case.positions[b : b + 1], case.logits[b : b + 1])
        for b in range(17)
    ]
    perm = np.random.default_rng(6).permutation(17)
    previous = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        out, lp, ids, num = case.run(case.slots[perm], case.positions[perm], case.logits[perm])
    finally:
        numba.set_num_threads(previous)
    for i, b in enumerate(perm):
        a_out, a_lp, a_ids, a_num = alone[b]
        assert out[i] == a_out[0]
        assert ids[b, case.positions[b]] == a_out[0] and num[b] == case.positions[b] + 1
        if rows[b].get("num_logprobs") is not None:
            for field, a_field in zip(lp, a_lp, strict=True):
                assert field[i].tobytes() == a_field[0].tobytes()


def test_mirror_writes_and_padding():
    case = Case(np.random.default_rng(7), spread())
    logits_before = case.logits.copy()
    case.logits.setflags(write=False)  # read-only logits are accepted (and never written)
    slots = np.array([3, -1, 5], np.int32)
    positions = np.array([300, 9999, 301], np.int32)
    out, _, ids, num = case.run(slots, positions, case.logits[:3])
    assert out[1] == -1
    np.testing.assert_array_equal(case.logits, logits_before)
    expected_ids, expected_num = case.token_ids.copy(), case.num_tokens.copy()
    expected_ids[[3, 5], [300, 301]] = out[[0, 2]]
    expected_num[[3, 5]] = [301, 302]
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_array_equal(num, expected_num)


def test_prompt_logprobs_matches_reference():
    rng = np.random.default_rng(8)
    logits = grid_logits(rng, 9, vocab=5000)
    logits[2, [10, 11, 12]] = logits[2].max()  # ties at the top: lower id first
    next_ids = rng.integers(0, 5000, 9).astype(np.int32)
    next_ids[[2, 8]] = [11, -1]
    for k in (0, 4, 20):
        lp, rank = np.empty(9, np.float32), np.empty(9, np.int32)
        top_ids, top_lps = np.empty((9, 20), np.int32), np.empty((9, 20), np.float32)
        prompt_logprobs(logits, next_ids, k, lp, rank, top_ids, top_lps)
        for t, (ref_lp, ref_rank, ref_ids, ref_lps) in enumerate(
            prompt_logprobs_ref(logits, next_ids, k)
        ):
            np.testing.assert_allclose(lp[t], ref_lp, atol=2e-6, rtol=1e-6)
            assert rank[t] == ref_rank
            np.testing.assert_array_equal(top_ids[t, :k], ref_ids)
            np.testing.assert_allclose(top_lps[t, :k], ref_lps, atol=2e-6)
            assert (top_ids[t, k:] == -1).all() and (top_lps[t, k:] == -np.inf).all()
        assert rank[2] == 2  # tied with id 10, which ranks first
        assert top_ids[2, : min(k, 3)].tolist() == [10, 11, 12][: min(k, 3)]


def test_launcher_checks():
    case = Case(np.random.default_rng(9), spread())
    ok = dict(slots=case.slots, positions=case.positions, logits=case.logits)
    for bad in (
        dict(logits=case.logits.astype(np.float64)),
        dict(logits=case.logits[:, ::2]),
        dict(slots=case.slots[:3]),
        dict(positions=case.positions.astype(np.int64)),
        dict(positions=np.full(8, MAX_LEN, np.int32)),
        dict(slots=np.full(8, SLOTS, np.int32)),
    ):
        with pytest.raises(ValueError):
            case.run(**{**ok, **bad})
    out = np.empty(8, np.int32)
    with pytest.raises(ValueError):
        sample(
            case.logits,
            case.slots,
            case.positions,
            case.table,
            case.token_ids[:, ::2],
            case.num_tokens,
            out,
        )
    with pytest.raises(ValueError):
        case.table.set_slot(0, **{**DEFAULTS, "logit_bias": {i: 1.0 for i in range(301)}})
    lp, rank = np.empty(8, np.float32), np.empty(8, np.int32)
    ids, lps = np.empty((8, 20), np.int32), np.empty((8, 20), np.float32)
    nxt = np.zeros(8, np.int32)
    for args in (
        (case.logits, nxt, 21, lp, rank, ids, lps),
        (case.logits, nxt + V, 3, lp, rank, ids, lps),
        (case.logits, nxt, 3, lp, rank.astype(np.int64), ids, lps),
        (case.logits, nxt, 3, lp, rank, ids[:, :2], lps),
    ):
        with pytest.raises(ValueError):
            prompt_logprobs(*args)
