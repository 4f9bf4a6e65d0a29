"""The device sampler vs the CPU sampler and the float64 reference: greedy (ties to the lowest
id), seeded temperature sampling (the CPU's counter-based uniform, bit for bit), padding rows,
and every filter and adjustment alone and combined (test_sampling_features.py).

Logits sit on a 1/32 grid: ties are exact and every probability boundary is far from float
noise, so token ids must match exactly."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from vtllm.kernels.cpu.sampling import sample as cpu_sample
from vtllm.kernels.cuda import SamplerScratch, device_table, sample
from vtllm.kernels.sampling_reference import sample_ref
from vtllm.kernels.sampling_table import SamplingTable

pytestmark = pytest.mark.cudasim

V = 300 if SIMULATOR else 152064  # Qwen's vocabulary on the GPU
SLOTS, MAX_LEN = 10, 64
NEUTRAL = dict(
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    repetition_penalty=1.0,
    min_tokens=0,
    num_logprobs=None,
    prompt_len=4,
    logit_bias=None,
    min_stop_ids=[],
)


def make_case(rng, settings, vocab=V, history=None, slots=SLOTS):
    """A table with settings per slot and a random mirror (ids below history repeat often)."""
    table = SamplingTable.create(slots)
    for slot, kw in settings.items():
        table.set_slot(slot, **{**NEUTRAL, "seed": 1000 + slot, **kw})
    token_ids = rng.integers(0, history or vocab, (slots, MAX_LEN)).astype(np.int32)
    num_tokens = np.full(slots, 20, np.int32)
    return table, token_ids, num_tokens


def run_device(logits, slots, positions, table, token_ids, num_tokens, scratch=None):
    ids_dev, num_dev = dev(token_ids), dev(num_tokens)
    out = poisoned(len(slots), np.int32)
    sample(
        dev(logits),
        dev(slots),
        dev(positions),
        device_table(table),
        ids_dev,
        num_dev,
        out,
        scratch=scratch,
    )
    return host(out), host(ids_dev), host(num_dev)


def run_cpu(logits, slots, positions, table, token_ids, num_tokens):
    ids, num, out = token_ids.copy(), num_tokens.copy(), np.full(len(slots), -7, np.int32)
    cpu_sample(logits, slots, positions, table, ids, num, out)
    return out, ids, num


def grid_logits(rng, rows, scale=3.0, vocab=V):
    return (np.round(rng.standard_normal((rows, vocab)) * scale * 32) / 32).astype(np.float32)


def assert_matches_cpu_and_reference(logits, slots, positions, table, token_ids, num_tokens):
    got, ids, num = run_device(logits, slots, positions, table, token_ids, num_tokens)
    cpu, cpu_ids, cpu_num = run_cpu(logits, slots, positions, table, token_ids, num_tokens)
    ref, _ = sample_ref(logits, slots, positions, table, token_ids.copy(), num_tokens.copy())
    np.testing.assert_array_equal(got, cpu)
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(ids, cpu_ids)
    np.testing.assert_array_equal(num, cpu_num)
    return got


def test_greedy_and_temperature_match_reference_and_cpu(rng):
    settings = {
        0: dict(temperature=0.0),
        1: dict(temperature=0.7),
        2: dict(temperature=1.0),
        3: dict(temperature=1.6, seed=2**64 - 5),
        5: dict(temperature=0.0),
        6: dict(temperature=0.3),
        8: dict(temperature=0.8, top_k=3, top_p=0.5),
        9: dict(temperature=0.8),
    }
    table, token_ids, num_tokens = make_case(rng, settings)
    slots = np.array([3, 0, -1, 1, 5, 2, 6, 8, 9], np.int32)  # -1: padding
    positions = np.array([20, 21, 5, 22, 30, 20, 63, 20, 20], np.int32)
    logits = grid_logits(rng, len(slots))
    logits[1, [7, V - 3]] = logits[1].max() + 1  # greedy tie: the lower id wins
    logits[4, :] = -np.inf
    logits[4, [11, 12]] = 0.5
    logits[7:, :] = -np.inf  # nothing finite: token 0, as the CPU
    got = assert_matches_cpu_and_reference(logits, slots, positions, table, token_ids, num_tokens)
    assert got[1] == 7 and got[4] == 11 and got[2] == -1 and (got[7:] == 0).all()


@pytest.mark.skipif(SIMULATOR, reason="a 262,208-token row is minutes in the simulator")
def test_a_vocabulary_past_two_to_the_18_matches_cpu(rng):
    """Gemma 3's vocabulary (262,208 > 2^18): a flat row puts every token in one bin of the
    descent (the packed count and the low halves' sum at their largest), random rows cut by
    top_p / min_p / top_k and draw."""
    vocab = 262208
    settings = {
        0: dict(temperature=1.0, top_p=0.5),
        1: dict(temperature=1.0, top_p=0.9),
        2: dict(temperature=0.7, min_p=0.01),
        3: dict(temperature=1.3, top_k=50, top_p=0.8),
        4: dict(temperature=0.0),
    }
    table, token_ids, num_tokens = make_case(rng, settings, vocab=vocab)
    slots = np.arange(5, dtype=np.int32)
    positions = np.full(5, 20, np.int32)
    logits = grid_logits(rng, 5, vocab=vocab)
    logits[0] = 0.25
    got = assert_matches_cpu_and_reference(logits, slots, positions, table, token_ids, num_tokens)
    assert got[4] == int(np.argmax(logits[4]))


def test_draws_follow_the_distribution(rng):
    """Many positions of one seeded row: draws land in proportion to softmax(x / T), and on
    the CPU's tokens, with and without a filter (a filter walks by probability, not id)."""
    v = 8
    logits = np.zeros((1, V), np.float32) - np.inf
    logits[0, :v] = np.log(np.arange(1, v + 1, dtype=np.float32))
    n = 16 if SIMULATOR else 4000
    for filt in (dict(), dict(top_k=v - 1)):
        table, _, _ = make_case(rng, {0: dict(temperature=1.0, **filt)})
        table = SamplingTable(**{f: getattr(table, f)[:1] for f in table.__slots__})
        ids_dev, num_dev = dev(np.zeros((1, n), np.int32)), dev(np.zeros(1, np.int32))
        table_dev, logits_dev = device_table(table), dev(logits)
        slots_dev = dev(np.zeros(1, np.int32))
        out = poisoned(1, np.int32)
        for pos in range(n):
            sample(
                logits_dev,
                slots_dev,
                dev(np.array([pos], np.int32)),
                table_dev,
                ids_dev,
                num_dev,
                out,
            )
        seen = host(ids_dev)[0].tolist()
        assert host(num_dev)[0] == n and host(out)[0] == seen[-1]
        assert seen == [int(cpu) for cpu in _cpu_draws(logits, table, n)]
        if not SIMULATOR:
            freq = np.bincount(seen, minlength=v)[:v] / n
            want = np.arange(1, v + 1, dtype=np.float64)
            if filt:
                want[0] = 0.0  # top_k = v - 1 drops the least likely token, id 0
            np.testing.assert_allclose(freq, want / want.sum(), atol=0.03)


def _cpu_draws(logits, table, n):
    ids, num, out = np.zeros((1, n), np.int32), np.zeros(1, np.int32), np.empty(1, np.int32)
    for pos in range(n):
        cpu_sample(logits, np.zeros(1, np.int32), np.array([pos], np.int32), table, ids, num, out)
        yield out[0]


def test_deterministic_and_scratch_counts_left_zero(rng):
    """The same inputs twice give the same tokens; the penalty counts go back to zero."""
    settings = {
        0: dict(temperature=1.1, repetition_penalty=1.4, frequency_penalty=0.3, top_p=0.7),
        1: dict(temperature=0.9, presence_penalty=0.6, min_p=0.05, top_k=9),
    }
    table, token_ids, num_tokens = make_case(rng, settings, history=12)
    slots, positions = np.array([1, 0], np.int32), np.array([40, 33], np.int32)
    logits = grid_logits(rng, 2)
    logits[:, :12] += 4.0  # the history's tokens lead, so the penalties decide
    scratch = SamplerScratch.create(4, V)
    first = run_device(logits, slots, positions, table, token_ids, num_tokens, scratch)[0]
    second = run_device(logits, slots, positions, table, token_ids, num_tokens, scratch)[0]
    np.testing.assert_array_equal(first, second)
    assert not host(scratch.counts).any()
    np.testing.assert_array_equal(
        first, run_cpu(logits, slots, positions, table, token_ids, num_tokens)[0]
    )


def test_rejects_bad_arguments(rng):
    table, token_ids, num_tokens = make_case(rng, {})
    logits = dev(grid_logits(rng, 2))
    two = dev(np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="device array"):
        sample(logits, two, two, table, dev(token_ids), dev(num_tokens), poisoned(2, np.int32))
    with pytest.raises(ValueError, match="out_tokens"):
        sample(
            logits,
            two,
            two,
            device_table(table),
            dev(token_ids),
            dev(num_tokens),
            poisoned(3, np.int32),
        )
    with pytest.raises(ValueError, match="scratch has 1 rows"):
        sample(
            logits,
            two,
            two,
            device_table(table),
            dev(token_ids),
            dev(num_tokens),
            poisoned(2, np.int32),
            scratch=SamplerScratch.create(1, V),
        )
    with pytest.raises(ValueError, match="vocabulary of 524289"):
        sample(
            dev(np.zeros((2, 2**19 + 1), np.float32)),
            two,
            two,
            device_table(table),
            dev(token_ids),
            dev(num_tokens),
            poisoned(2, np.int32),
        )
