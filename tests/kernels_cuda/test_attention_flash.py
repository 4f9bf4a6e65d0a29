"""attention_flash (tensor-core prefill attention over a bf16 cache) against the float64
reference on bf16-rounded queries; a row's bits whatever else is in the step or how its prompt
was chunked; rows it must leave unwritten."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from tests.kernels_cuda.test_attention import bf16_values, build
from vtllm.kernels.cuda import _attention_flash as attention_flash
from vtllm.kernels.reference import paged_attention_ref
from vtllm.models.synthetic import to_bf16_bits

pytestmark = pytest.mark.cudasim

# (Hq, Hk, D, block_size, [(new tokens, context) per sequence])
CASES = [
    (4, 2, 16, 4, [(5, 5), (3, 9), (1, 40), (0, 0)]),  # prefill, chunk, decode row, empty
    (2, 1, 32, 8, [(20, 40)]),  # a chunk over several key tiles
    (8, 1, 16, 16, [(6, 6), (3, 3)]),  # G = 8: four tokens a tile, a run boundary inside one
]
if not SIMULATOR:
    CASES += [
        (32, 8, 128, 16, [(200, 300), (64, 64), (1, 1000)]),
        (16, 8, 128, 16, [(1024, 1024)]),
        (16, 16, 64, 32, [(64, 64), (7, 2500)]),
    ]


def bf16_round(x):
    return bf16_values(to_bf16_bits(x))


def run(q, k_cache, v_cache, tables, seq_lens, qsl, first_token=0):
    t, hq, d = q.shape
    out = poisoned((t, hq, d))
    attention_flash.flash_prefill(
        dev(q),
        dev(k_cache),
        dev(v_cache),
        dev(tables),
        dev(seq_lens),
        dev(qsl),
        d**-0.5,
        out,
        first_token=first_token,
    )
    return host(out)


def problem(rng, case):
    hq, hk, d, bs, seqs = case
    k_cache, v_cache, tables, seq_lens, qsl, slots = build(rng, hk, d, bs, seqs)
    q = (rng.standard_normal((slots.shape[0], hq, d)) * 2).astype(np.float32)
    return q, to_bf16_bits(k_cache), to_bf16_bits(v_cache), tables, seq_lens, qsl


def reference(q, k_cache, v_cache, tables, seq_lens, qsl):
    d = q.shape[2]
    return paged_attention_ref(
        bf16_round(q), bf16_values(k_cache), bf16_values(v_cache), tables, seq_lens, qsl, d**-0.5
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"hq{c[0]}-hk{c[1]}-d{c[2]}-bs{c[3]}")
def test_matches_reference(rng, case):
    """Within the rounding of p to bf16 (p in [0, 1]: 2^-9 of |v| at most per key)."""
    hq, hk, d, bs, seqs = case
    assert attention_flash.supports(np.zeros(1, np.uint16), hq, hk, d)
    q, k_cache, v_cache, tables, seq_lens, qsl = problem(rng, case)
    got = run(q, k_cache, v_cache, tables, seq_lens, qsl)
    ref = reference(q, k_cache, v_cache, tables, seq_lens, qsl)
    live = qsl[-1]
    np.testing.assert_allclose(got[:live], ref[:live], rtol=0, atol=2e-2)
    assert np.abs(got[:live] - ref[:live]).mean() < 2e-3
    assert np.isnan(got[live:]).all(), "rows past every sequence must stay unwritten"
    # from a later first row: the rows before it are left alone, the others keep their bits
    later = run(q, k_cache, v_cache, tables, seq_lens, qsl, first_token=2)
    assert np.isnan(later[:2]).all()
    np.testing.assert_array_equal(later[2:live], got[2:live])


def test_a_rows_bits_do_not_depend_on_the_step(rng):
    """The same prompt alone, after another sequence (other tiles, other places in them) and
    as the second chunk of itself: the same bits for its rows."""
    hq, hk, d, bs = 4, 2, 32, 8
    seqs = [(9, 9), (30, 30)]
    q, k_cache, v_cache, tables, seq_lens, qsl = problem(rng, (hq, hk, d, bs, seqs))
    both = run(q, k_cache, v_cache, tables, seq_lens, qsl)
    mine = slice(9, 39)
    alone = run(q[mine], k_cache, v_cache, tables[1:], seq_lens[1:], np.array([0, 30], np.int32))
    np.testing.assert_array_equal(alone, both[mine])
    # its last 13 tokens as a chunk (the first 17 already in the cache)
    chunk = run(
        q[mine][17:], k_cache, v_cache, tables[1:], seq_lens[1:], np.array([0, 13], np.int32)
    )
    np.testing.assert_array_equal(chunk, both[mine][17:])


def test_rows_past_a_bad_block_table_entry_stay_unwritten(rng):
    """An entry outside the cache: rows whose window reaches it are left unwritten, the rows
    before it are computed."""
    hq, hk, d, bs = 2, 1, 16, 4
    q, k_cache, v_cache, tables, seq_lens, qsl = problem(rng, (hq, hk, d, bs, [(12, 12)]))
    ref = reference(q, k_cache, v_cache, tables, seq_lens, qsl)
    tables[0, 2] = k_cache.shape[0] + 3  # keys 8 .. 11
    got = run(q, k_cache, v_cache, tables, seq_lens, qsl)
    np.testing.assert_allclose(got[:8], ref[:8], rtol=0, atol=2e-2)
    assert np.isnan(got[8:]).all()
