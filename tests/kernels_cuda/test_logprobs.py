"""Logprobs on the device vs the CPU (kernels/cpu/logprobs.py) and the float64 reference: the
sampled token's raw logprob and rank, the top n ids and logprobs (ties by lower id), -1 / -inf
past n, rows without logprobs and padding rows left untouched; prompt logprobs likewise."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from tests.kernels_cuda.test_sampling import grid_logits, make_case
from vtllm.kernels.cpu.logprobs import prompt_logprobs as cpu_prompt_logprobs
from vtllm.kernels.cpu.sampling import sample as cpu_sample
from vtllm.kernels.cuda import LogprobsOut, device_table, prompt_logprobs, sample
from vtllm.kernels.sampling_reference import prompt_logprobs_ref
from vtllm.kernels.sampling_table import MAX_TOP_LOGPROBS
from vtllm.kernels.sampling_table import LogprobsOut as CpuLogprobsOut

pytestmark = pytest.mark.cudasim

V = 257 if SIMULATOR else 152064


def poisoned_logprobs(n, width=MAX_TOP_LOGPROBS):
    return LogprobsOut(
        poisoned(n), poisoned(n, np.int32), poisoned((n, width), np.int32), poisoned((n, width))
    )


def assert_close_logprobs(got, want, rows):
    """Ids and ranks exactly; logprobs to float32 rounding (-inf where the CPU has -inf)."""
    got = [host(a) for a in got]
    np.testing.assert_array_equal(got[1][rows], want[1][rows])
    np.testing.assert_array_equal(got[2][rows], want[2][rows])
    for g, w in ((got[0], want[0]), (got[3], want[3])):
        np.testing.assert_allclose(g[rows], w[rows], rtol=2e-6, atol=2e-5)
    return got


def test_sample_logprobs_match_cpu(rng):
    settings = {
        0: dict(temperature=0.0, num_logprobs=20),
        1: dict(temperature=0.9, top_k=8, num_logprobs=3),
        2: dict(temperature=1.0, num_logprobs=None),
        3: dict(temperature=0.0, num_logprobs=0, logit_bias={11: 40.0}),
        4: dict(temperature=1.3, num_logprobs=7, repetition_penalty=1.4, top_p=0.8),
    }
    table, token_ids, num_tokens = make_case(rng, settings, vocab=V)
    slots = np.array([1, -1, 0, 3, 2, 4], np.int32)
    positions = np.array([21, 0, 20, 30, 22, 25], np.int32)
    logits = grid_logits(rng, len(slots), vocab=V)
    logits[2, [3, 90, V - 1]] = logits[2].max() + 0.5  # tied top ids
    logits[4, 100:] = -np.inf
    lp = poisoned_logprobs(len(slots))
    out = poisoned(len(slots), np.int32)
    sample(
        dev(logits),
        dev(slots),
        dev(positions),
        device_table(table),
        dev(token_ids),
        dev(num_tokens),
        out,
        out_logprobs=lp,
    )
    want = CpuLogprobsOut.create(len(slots))
    cpu_tokens = np.empty(len(slots), np.int32)
    cpu_sample(
        logits,
        slots,
        positions,
        table,
        token_ids.copy(),
        num_tokens.copy(),
        cpu_tokens,
        out_logprobs=want,
    )
    np.testing.assert_array_equal(host(out), cpu_tokens)
    with_lp = [0, 2, 3, 5]  # slots 1, 0, 3, 4
    got = assert_close_logprobs(lp, want, with_lp)
    assert got[1][3] > 1 and host(out)[3] == 11  # biased to 11; the raw rank says otherwise
    np.testing.assert_array_equal(got[2][2, :3], [3, 90, V - 1])
    assert (got[2][3] == -1).all() and np.isneginf(got[3][3]).all()  # num_logprobs 0
    for b in (1, 4):  # padding and a slot without logprobs: untouched
        assert np.isnan(got[0][b]) and got[1][b] == -7 and (got[2][b] == -7).all()


@pytest.mark.parametrize("k, width", [(0, 20), (5, 20), (20, 24)])
def test_prompt_logprobs_match_cpu_and_reference(rng, k, width):
    T = 4
    logits = grid_logits(rng, T, vocab=V)
    logits[1, :] = -np.inf
    logits[1, [2, 9, 4]] = [0.5, 0.5, -1.0]  # fewer finite than k: the rest in id order
    logits[3, 50:70] = logits[3].max()  # ties at the top
    next_ids = np.array([7, 9, -1, 60], np.int32)
    got = poisoned_logprobs(T, width)
    prompt_logprobs(dev(logits), dev(next_ids), k, *got)
    want = CpuLogprobsOut(
        np.empty(T, np.float32),
        np.empty(T, np.int32),
        np.empty((T, width), np.int32),
        np.empty((T, width), np.float32),
    )
    cpu_prompt_logprobs(logits, next_ids, k, *want)
    got = assert_close_logprobs(got, want, slice(None))
    assert np.isnan(got[0][2]) and got[1][2] == 0  # no next token
    ref = prompt_logprobs_ref(logits, next_ids, k)
    for t, (lp, rank, ids, lps) in enumerate(ref):
        assert got[1][t] == rank
        np.testing.assert_array_equal(got[2][t, :k], ids)
        np.testing.assert_allclose(got[3][t, :k], lps, rtol=2e-6, atol=2e-5)
        if t != 2:
            np.testing.assert_allclose(got[0][t], lp, rtol=2e-6, atol=2e-5)


def test_prompt_logprobs_rejects_bad_k(rng):
    logits, ids = dev(grid_logits(rng, 2, vocab=V)), dev(np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="k = 21"):
        prompt_logprobs(logits, ids, 21, *poisoned_logprobs(2, 24))
    with pytest.raises(ValueError, match="k = 6"):
        prompt_logprobs(logits, ids, 6, *poisoned_logprobs(2, 5))
