"""Every sampler feature on the device, alone and combined, against the CPU sampler and the
float64 reference on fresh random logits: top_k (1, small, V - 1, past V), top_p (tiny, mid),
min_p, logit bias (to -inf too), min_tokens masking eos, repetition / frequency / presence
penalties over a history with repeated ids, coarse logits with many ties at every cut, and
hand-built histories for the prompt / output split; then a batch of random mixes.

Each case checks the tokens, the mirror, and that the feature changed some token (against the
same rows without it), so a sampler that ignores it fails."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR
from tests.kernels_cuda.test_sampling import (
    MAX_LEN,
    SLOTS,
    V,
    assert_matches_cpu_and_reference,
    grid_logits,
    make_case,
    run_cpu,
)
from vtllm.kernels.sampling_reference import uniform

pytestmark = pytest.mark.cudasim

HISTORY = 16  # the mirror holds ids below this, so they repeat; their logits get a lift

CASES = {
    "top_k": [
        dict(top_k=1),
        dict(top_k=5, temperature=1.5),
        dict(top_k=V - 1, temperature=2),
        dict(top_k=V + 7, temperature=2),
    ],
    "top_p": [
        dict(top_p=1e-6, temperature=3.0),
        dict(top_p=0.9, temperature=1.3),
        dict(top_p=0.5, temperature=2.5),
        dict(top_p=0.05, temperature=4.0),
    ],
    "min_p": [
        dict(min_p=0.1, temperature=2.0),
        dict(min_p=0.5, temperature=4.0),
        dict(min_p=0.02, top_k=10, temperature=3.0),
        dict(min_p=0.9, temperature=0.9),
    ],
    "combined": [
        dict(top_k=20, top_p=0.8, min_p=0.02, temperature=2.0),
        dict(top_k=3, top_p=0.3, temperature=5.0),
        dict(
            top_k=50,
            top_p=0.95,
            min_p=0.01,
            temperature=1.7,
            repetition_penalty=1.3,
            logit_bias={3: 5.0, 9: -np.inf},
        ),
        dict(top_p=0.7, temperature=2.2, frequency_penalty=0.5, presence_penalty=0.5),
    ],
    "repetition": [
        dict(temperature=0.0, repetition_penalty=1.8),
        dict(temperature=0.0, repetition_penalty=0.6),
        dict(temperature=1.0, repetition_penalty=1.5),
        dict(temperature=0.0, repetition_penalty=2.5, prompt_len=0),
    ],
    "frequency_presence": [
        dict(temperature=0.0, frequency_penalty=1.2),
        dict(temperature=0.0, presence_penalty=2.5),
        dict(temperature=1.2, frequency_penalty=0.8, presence_penalty=-0.4),
        dict(temperature=0.0, frequency_penalty=2.0, prompt_len=30),
    ],
    "logit_bias": [
        dict(temperature=0.0, logit_bias="-inf on the top 3"),
        dict(temperature=0.0, logit_bias={7: 9.0, 8: 9.0}),
        dict(temperature=1.0, logit_bias="all but 4 to -inf"),
        dict(temperature=0.7, top_k=4, logit_bias={2: -3.5, 250 % V: 12.0}),
    ],
    "min_tokens": [
        dict(temperature=0.0, min_tokens=100, min_stop_ids="top 2"),
        dict(temperature=0.0, min_tokens=3, min_stop_ids="top 2"),  # reached
        dict(temperature=1.0, min_tokens=100, min_stop_ids="top 1"),
        dict(temperature=0.0, min_tokens=100, min_stop_ids="top 1", logit_bias="-inf on the top 3"),
    ],
}


def _resolve(kw, row):
    """Turns the symbolic settings into ids of this row's logits."""
    kw = dict(kw)
    top = np.argsort(-row, kind="stable")
    if kw.get("logit_bias") == "-inf on the top 3":
        kw["logit_bias"] = {int(t): -np.inf for t in top[:3]}
    elif kw.get("logit_bias") == "all but 4 to -inf":
        kw["logit_bias"] = {t: -np.inf for t in range(min(V, 300)) if t not in (1, 5, 40, 41)}
    if isinstance(kw.get("min_stop_ids"), str):
        kw["min_stop_ids"] = [int(t) for t in top[: int(kw["min_stop_ids"][-1])]]
    kw.setdefault("temperature", 1.0)
    return kw


@pytest.mark.parametrize("feature", list(CASES))
def test_feature_matches_cpu(rng, feature):
    logits = grid_logits(rng, 5)
    logits[:, :HISTORY] += 3.0  # the history's ids lead, so penalties decide tokens
    if feature == "combined":
        logits[:, 100:140] = 1.25  # a block of exact ties across the cuts
    slots = np.array([2, -1, 0, 5, 3], np.int32)
    positions = np.array([24, 0, 20, 40, MAX_LEN - 1], np.int32)
    rows = {int(s): b for b, s in enumerate(slots) if s >= 0}
    settings = {
        s: _resolve(kw, logits[rows[s]]) for s, kw in zip(rows, CASES[feature], strict=True)
    }
    table, token_ids, num_tokens = make_case(rng, settings, history=HISTORY)
    got = assert_matches_cpu_and_reference(logits, slots, positions, table, token_ids, num_tokens)
    assert got[1] == -1
    plain = {s: {"temperature": kw["temperature"]} for s, kw in settings.items()}
    base = make_case(rng, plain, history=HISTORY)[0]
    without = run_cpu(logits, slots, positions, base, token_ids, num_tokens)[0]
    assert (got != without).any(), f"{feature} changed no token: {got} vs {without}"


def test_ties_at_every_cut(rng):
    """Coarse logits (steps of 1/2): the k-th token, the top_p boundary and the draw all land
    in groups of equal values, where the lower id must go first. Row 3 is flat (every e is
    exactly 1): top_k 4 keeps ids 0-3, top_p 0.5 needs exactly 2.0 of their 4.0 and takes
    ids 0 and 1 (the mass reaching the target counts, as on the CPU); its seed puts u above
    0.7, so a cut one token too late would draw id 2."""
    logits = (np.round(rng.standard_normal((4, V)) * 2) / 2).astype(np.float32)
    logits[3] = 0.5
    seed = next(s for s in range(100) if uniform(s, 20) > 0.7)
    settings = {
        0: dict(temperature=1.0, top_k=7),
        1: dict(temperature=2.0, top_p=0.4),
        2: dict(temperature=1.5, top_k=30, top_p=0.6, min_p=0.2),
        3: dict(temperature=1.0, top_k=4, top_p=0.5, seed=seed),
    }
    table, token_ids, num_tokens = make_case(rng, settings)
    for pos in (20, 21):
        positions = np.full(4, pos, np.int32)
        got = assert_matches_cpu_and_reference(
            logits, np.arange(4, dtype=np.int32), positions, table, token_ids, num_tokens
        )
        assert got[3] in (0, 1) and (pos != 20 or got[3] == 1)


def test_penalties_split_prompt_and_output(rng):
    """Hand-built histories: repetition covers the prompt, frequency / presence only the
    output (from prompt_len), frequency scales with the count, and a negative logit is
    multiplied by the repetition penalty, not divided."""
    logits = grid_logits(rng, 4, scale=0.5) - 8.0  # all negative; a, b, c lead
    a, b, c = 5, 6, 7
    logits[:, a], logits[:, b], logits[:, c] = -0.5, -1.0, -2.5
    settings = {
        0: dict(temperature=0.0, presence_penalty=3.0, prompt_len=10),
        1: dict(temperature=0.0, repetition_penalty=3.0, prompt_len=10),
        2: dict(temperature=0.0, repetition_penalty=1.5, prompt_len=10),
        3: dict(temperature=0.0, frequency_penalty=1.0, prompt_len=10),
    }
    table, token_ids, num_tokens = make_case(rng, settings)
    token_ids[:, :20] = 200 % V  # filler with a low logit
    logits[:, 200 % V] = -30.0
    token_ids[0, 3], token_ids[0, 12:14] = a, b  # a: prompt only; b: output
    token_ids[1, 3] = a  # a: prompt only, still repeated
    token_ids[2, [4, 15]] = a, b
    logits[2, c] = -0.6  # above a * 1.5, below a / 1.5
    token_ids[3, [11, 12, 13]], token_ids[3, 17] = b, c  # b three times, c once
    logits[3, a], logits[3, c] = -30.0, -1.2  # b - 3 * 1.0 < c - 1.0 < b - 1.0
    positions = np.full(4, 20, np.int32)
    got = assert_matches_cpu_and_reference(
        logits, np.arange(4, dtype=np.int32), positions, table, token_ids, num_tokens
    )
    np.testing.assert_array_equal(got, [a, b, c, c])


def test_random_mix_matches_cpu(rng):
    """A batch whose every row draws its own random mix of features (larger on a GPU)."""
    B = 4 if SIMULATOR else 48
    slots = rng.permutation(SLOTS if SIMULATOR else 64)[:B].astype(np.int32)
    slots[rng.random(B) < 0.15] = -1
    settings = {}
    for s in slots[slots >= 0].tolist():
        kw = dict(temperature=float(rng.choice([0.0, 0.5, 1.0, 1.7])))
        for name, values in POOL.items():
            if rng.random() < 0.4:
                kw[name] = values[rng.integers(len(values))]
        settings[s] = kw
    logits = grid_logits(rng, B)
    logits[:, :HISTORY] += 2.0
    table, token_ids, num_tokens = make_case(
        rng, settings, history=HISTORY, slots=int(slots.max()) + 1
    )
    positions = rng.integers(10, MAX_LEN, B).astype(np.int32)
    assert_matches_cpu_and_reference(logits, slots, positions, table, token_ids, num_tokens)


POOL = {
    "top_k": [1, 4, 40],
    "top_p": [1e-6, 0.3, 0.9],
    "min_p": [0.05, 0.3],
    "repetition_penalty": [0.7, 1.6],
    "frequency_penalty": [-0.5, 1.1],
    "presence_penalty": [0.8],
    "logit_bias": [{1: -np.inf, 2: 6.0}],
    "prompt_len": [0, 12],
    "min_tokens": [100],
    "min_stop_ids": [[0, 3]],
}
