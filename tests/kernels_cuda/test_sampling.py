"""The device sampler vs the float64 reference and the CPU sampler: greedy (ties to the lowest
id), seeded temperature sampling (the CPU's counter-based uniform, bit for bit), padding rows,
and rows that ask for what it does not do yet (UNSUPPORTED, mirror untouched).

Logits sit on a 1/32 grid: ties are exact and every probability boundary is far from float
noise, so token ids must match exactly."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from vtllm.kernels.cpu.sampling import sample as cpu_sample
from vtllm.kernels.cuda import UNSUPPORTED, device_table, sample
from vtllm.kernels.sampling_reference import sample_ref
from vtllm.kernels.sampling_table import SamplingTable

pytestmark = pytest.mark.cudasim

V = 300 if SIMULATOR else 128256
SLOTS, MAX_LEN = 10, 64
NEUTRAL = dict(
    top_k=0, top_p=1.0, min_p=0.0, presence_penalty=0.0, frequency_penalty=0.0,
    repetition_penalty=1.0, min_tokens=0, num_logprobs=None, prompt_len=4, logit_bias=None,
    min_stop_ids=[],
)  # fmt: skip


def make_case(rng, settings):
    table = SamplingTable.create(SLOTS)
    for slot, kw in settings.items():
        table.set_slot(slot, **{**NEUTRAL, "seed": 1000 + slot, **kw})
    token_ids = rng.integers(0, V, (SLOTS, MAX_LEN)).astype(np.int32)
    num_tokens = np.full(SLOTS, 20, np.int32)
    return table, token_ids, num_tokens


def run_device(logits, slots, positions, table, token_ids, num_tokens):
    ids_dev, num_dev = dev(token_ids), dev(num_tokens)
    out = poisoned(len(slots), np.int32)
    sample(dev(logits), dev(slots), dev(positions), device_table(table), ids_dev, num_dev, out)
    return host(out), host(ids_dev), host(num_dev)


def grid_logits(rng, rows, scale=3.0):
    return (np.round(rng.standard_normal((rows, V)) * scale * 32) / 32).astype(np.float32)


def test_greedy_and_temperature_match_reference_and_cpu(rng):
    settings = {0: dict(temperature=0.0), 1: dict(temperature=0.7), 2: dict(temperature=1.0),
                3: dict(temperature=1.6, seed=2**64 - 5), 5: dict(temperature=0.0),
                6: dict(temperature=0.3)}  # fmt: skip
    table, token_ids, num_tokens = make_case(rng, settings)
    slots = np.array([3, 0, -1, 1, 5, 2, 6], np.int32)  # -1: padding
    positions = np.array([20, 21, 5, 22, 30, 20, 63], np.int32)
    logits = grid_logits(rng, len(slots))
    logits[1, [7, V - 3]] = logits[1].max() + 1  # greedy tie: the lower id wins
    logits[4, :] = -np.inf
    logits[4, [11, 12]] = 0.5
    got, ids, num = run_device(logits, slots, positions, table, token_ids, num_tokens)
    ref_ids, ref_num = token_ids.copy(), num_tokens.copy()
    ref, _ = sample_ref(logits, slots, positions, table, ref_ids, ref_num)
    assert got[1] == 7 and got[4] == 11 and got[2] == -1
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(num, ref_num)
    cpu_ids, cpu_num, cpu_out = token_ids.copy(), num_tokens.copy(), np.empty(len(slots), np.int32)
    cpu_sample(logits, slots, positions, table, cpu_ids, cpu_num, cpu_out)
    np.testing.assert_array_equal(got, cpu_out)


def test_draws_follow_the_distribution(rng):
    """Many positions of one seeded row: draws land in proportion to softmax(x / T)."""
    v = 8
    logits = np.zeros((1, V), np.float32) - np.inf
    logits[0, :v] = np.log(np.arange(1, v + 1, dtype=np.float32))
    n = 48 if SIMULATOR else 4000
    table, token_ids, num_tokens = make_case(rng, {0: dict(temperature=1.0)})
    token_ids = np.zeros((1, n), np.int32)
    num_tokens = np.zeros(1, np.int32)
    table = SamplingTable(**{f: getattr(table, f)[:1] for f in table.__slots__})
    seen = []
    for pos in range(n):
        got, token_ids, num_tokens = run_device(logits, np.zeros(1, np.int32),
                                                np.array([pos], np.int32), table, token_ids,
                                                num_tokens)  # fmt: skip
        seen.append(got[0])
        assert token_ids[0, pos] == got[0] and num_tokens[0] == pos + 1
    want = [int(cpu) for cpu in _cpu_draws(logits, table, n)]
    assert seen == want
    if not SIMULATOR:
        freq = np.bincount(seen, minlength=v)[:v] / n
        np.testing.assert_allclose(freq, np.arange(1, v + 1) / (v * (v + 1) / 2), atol=0.03)


def _cpu_draws(logits, table, n):
    ids, num, out = np.zeros((1, n), np.int32), np.zeros(1, np.int32), np.empty(1, np.int32)
    for pos in range(n):
        cpu_sample(logits, np.zeros(1, np.int32), np.array([pos], np.int32), table, ids, num, out)
        yield out[0]


@pytest.mark.parametrize(
    "feature",
    [dict(top_k=5), dict(top_p=0.9), dict(min_p=0.1), dict(repetition_penalty=1.2),
     dict(frequency_penalty=0.5), dict(presence_penalty=-0.5), dict(logit_bias={3: 2.0}),
     dict(min_tokens=50, min_stop_ids=[4])],
    ids=lambda f: next(iter(f)),
)  # fmt: skip
def test_unsupported_rows_are_flagged(rng, feature):
    table, token_ids, num_tokens = make_case(rng, {0: dict(temperature=0.0, **feature),
                                                   1: dict(temperature=0.8)})  # fmt: skip
    slots, positions = np.array([0, 1], np.int32), np.array([20, 20], np.int32)
    logits = grid_logits(rng, 2)
    got, ids, num = run_device(logits, slots, positions, table, token_ids, num_tokens)
    assert got[0] == UNSUPPORTED
    assert ids[0, 20] == token_ids[0, 20] and num[0] == num_tokens[0]
    ref, _ = sample_ref(logits[1:], slots[1:], positions[1:], table, token_ids.copy(),
                        num_tokens.copy())  # fmt: skip
    assert got[1] == ref[0]


def test_rejects_bad_arguments(rng):
    table, token_ids, num_tokens = make_case(rng, {})
    logits = dev(grid_logits(rng, 2))
    two = dev(np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="device array"):
        sample(logits, two, two, table, dev(token_ids), dev(num_tokens), poisoned(2, np.int32))
    with pytest.raises(ValueError, match="out_tokens"):
        sample(logits, two, two, device_table(table), dev(token_ids), dev(num_tokens),
               poisoned(3, np.int32))  # fmt: skip
