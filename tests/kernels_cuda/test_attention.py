"""write_kv and paged_attention on the device vs the float64 references: varlen causal prefill,
a chunked prefill, decode, GQA, padding (slot -1, an empty sequence, rows past every sequence)."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from vtllm.kernels.cuda import _attention_ring as attention_ring
from vtllm.kernels.cuda import _attention_split as attention_split
from vtllm.kernels.cuda import paged_attention, write_kv
from vtllm.kernels.cuda.attention import RING_MIN_ROWS, make_scratch
from vtllm.kernels.reference import paged_attention_ref, write_kv_ref
from vtllm.models.synthetic import to_bf16_bits

pytestmark = pytest.mark.cudasim

# (Hq, Hk, D, block_size, [(new tokens, context) per sequence])
CASES = [
    (4, 2, 16, 4, [(5, 5), (3, 9), (1, 40), (0, 0)]),  # prefill, chunk, decode past 1 tile, pad
    (2, 2, 40, 8, [(1, 1), (4, 11)]),  # D not a multiple of 32: 64 threads, idle columns
    (2, 1, 8, 16, [(1, 130)]),  # decode over three key splits
    (2, 1, 32, 8, [(2, 40)]),  # D a multiple of 32: the score loop's unrolled path
]
if not SIMULATOR:
    CASES += [
        (32, 8, 128, 16, [(1, 1000), (1, 17), (1, 4097), (200, 300)]),
        (16, 16, 64, 32, [(64, 64), (1, 2500)]),
        (8, 4, 256, 16, [(1, 1000), (1, 17), (100, 300)]),  # Gemma's heads: wide variants
    ]


def build(rng, hk, d, bs, seqs, pad_rows=2):
    """A random cache, block tables over a shuffled pool (-1 past each sequence's blocks), and
    the new tokens' slots; T has pad_rows rows past every sequence."""
    need = [(ctx + bs - 1) // bs for _, ctx in seqs]
    num_blocks = sum(need) + 3
    width = max(need + [1]) + 1
    pool = rng.permutation(num_blocks).astype(np.int32)
    tables = np.full((len(seqs), width), -1, np.int32)
    slots, start = [], 0
    for s, (n, ctx) in enumerate(seqs):
        tables[s, : need[s]] = pool[start : start + need[s]]
        start += need[s]
        for pos in range(ctx - n, ctx):
            slots.append(tables[s, pos // bs] * bs + pos % bs)
    qsl = np.concatenate([[0], np.cumsum([n for n, _ in seqs])]).astype(np.int32)
    seq_lens = np.array([ctx for _, ctx in seqs], np.int32)
    shape = (num_blocks, bs, hk, d)
    k_cache = rng.standard_normal(shape).astype(np.float32)
    v_cache = rng.standard_normal(shape).astype(np.float32)
    slots = np.array(slots + [-1] * pad_rows, np.int32)
    return k_cache, v_cache, tables, seq_lens, qsl, slots


@pytest.mark.parametrize("path", ["whole-row", "split", "split-scratch"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"hq{c[0]}-hk{c[1]}-d{c[2]}-bs{c[3]}")
def test_matches_reference(rng, case, path, monkeypatch):
    hq, hk, d, bs, seqs = case
    k_cache, v_cache, tables, seq_lens, qsl, slots = build(rng, hk, d, bs, seqs)
    t = slots.shape[0]
    k = rng.standard_normal((t, hk, d)).astype(np.float32)
    v = rng.standard_normal((t, hk, d)).astype(np.float32)
    q = (rng.standard_normal((t, hq, d)) * 2).astype(np.float32)
    kc, vc = dev(k_cache), dev(v_cache)
    write_kv(dev(k), dev(v), kc, vc, dev(slots))
    ref_kc, ref_vc = write_kv_ref(k, v, k_cache, v_cache, slots)
    np.testing.assert_array_equal(host(kc), ref_kc)
    np.testing.assert_array_equal(host(vc), ref_vc)

    scale = d**-0.5

    def run(**kw):
        out = poisoned((t, hq, d))
        paged_attention(dev(q), kc, vc, dev(tables), dev(seq_lens), dev(qsl), scale, out, **kw)
        return host(out)

    scratch = make_scratch(t + 1, hq, d, int(seq_lens.max()) + 1)
    kw = {"whole-row": {"split": False}, "split": {}, "split-scratch": {"scratch": scratch}}
    got = run(**kw[path])
    ref = paged_attention_ref(q, ref_kc, ref_vc, tables, seq_lens, qsl, scale)
    live = qsl[-1]
    np.testing.assert_allclose(got[:live], ref[:live], rtol=0, atol=2e-5)
    assert np.isnan(got[live:]).all(), "rows past every sequence must stay unwritten"
    if path == "split-scratch":  # one block per split or one per row: the same bits
        np.testing.assert_array_equal(got, run())
        # a small decode grid: each block loops over several splits, still the same bits
        monkeypatch.setattr(attention_split, "TARGET_BLOCKS", 1)
        np.testing.assert_array_equal(got, run(scratch=scratch))


def bf16_values(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("path", ["whole-row", "split", "split-scratch"])
@pytest.mark.parametrize("case", [CASES[0], CASES[3]] + CASES[4:], ids=lambda c: f"d{c[2]}")
def test_bf16_cache_matches_reference(rng, case, path):
    """A cache of bf16 bits (uint16): write_kv rounds to nearest even, bit for bit as the host
    does, and attention over it is the float32 math on the exact bf16 values."""
    hq, hk, d, bs, seqs = case
    k_cache, v_cache, tables, seq_lens, qsl, slots = build(rng, hk, d, bs, seqs)
    k_cache, v_cache = to_bf16_bits(k_cache), to_bf16_bits(v_cache)
    t = slots.shape[0]
    k = rng.standard_normal((t, hk, d)).astype(np.float32)
    v = rng.standard_normal((t, hk, d)).astype(np.float32)
    q = (rng.standard_normal((t, hq, d)) * 2).astype(np.float32)
    kc, vc = dev(k_cache), dev(v_cache)
    write_kv(dev(k), dev(v), kc, vc, dev(slots))
    ref_kc, ref_vc = write_kv_ref(to_bf16_bits(k), to_bf16_bits(v), k_cache, v_cache, slots)
    np.testing.assert_array_equal(host(kc), ref_kc)
    np.testing.assert_array_equal(host(vc), ref_vc)
    kw = {"whole-row": {"split": False}, "split": {}}
    kw["split-scratch"] = {"scratch": make_scratch(t + 1, hq, d, int(seq_lens.max()) + 1)}
    meta = dev(tables), dev(seq_lens), dev(qsl)

    def run(**kw):
        out = poisoned((t, hq, d))
        paged_attention(dev(q), kc, vc, *meta, d**-0.5, out, **kw)
        return host(out)

    got = run(**kw[path])
    ref = paged_attention_ref(
        q, bf16_values(ref_kc), bf16_values(ref_vc), tables, seq_lens, qsl, d**-0.5
    )
    live = qsl[-1]
    np.testing.assert_allclose(got[:live], ref[:live], rtol=0, atol=2e-5)
    assert np.isnan(got[live:]).all(), "rows past every sequence must stay unwritten"
    if path == "split-scratch":  # the decode and the prefill kernel: the same bits
        np.testing.assert_array_equal(got, run())


# bf16 (the GPU default) on every case; under the simulator float32 on half of them (its item
# shapes are the older, simpler ones), on the card on all.
RING_CASES = [(c, "bfloat16") for c in CASES]
RING_CASES += [(c, "float32") for i, c in enumerate(CASES) if not SIMULATOR or i % 2 == 0]


@pytest.mark.parametrize(
    ("case", "kv"),
    RING_CASES,
    ids=lambda c: c if isinstance(c, str) else f"hq{c[0]}-hk{c[1]}-d{c[2]}-bs{c[3]}",
)
def test_ring_kernel_gives_the_split_kernels_bits(rng, case, kv, monkeypatch):
    """attention_ring's decode kernel (warps streaming their own splits) against the split
    kernel on the same step: the same out bits, also when each warp loops over several splits
    and with a bad block-table entry (its rows unwritten by both)."""
    ring_matches_split(rng, case, kv, monkeypatch)


@pytest.mark.parametrize("d", [20, 72])
def test_ring_kernel_bf16_piece_shapes(rng, d, monkeypatch):
    """The bf16 ring items CASES miss: 72 dims (16-byte pieces, a second and narrower K item
    of 64 dims) and 20 (rows not whole 16-byte pieces: 8-byte ones), the first row's three
    splits looped over by one warp at TARGET_BLOCKS 1."""
    ring_matches_split(rng, (1, 1, d, 8, [(1, 70), (1, 72)]), "bfloat16", monkeypatch)


def ring_matches_split(rng, case, kv, monkeypatch):
    hq, hk, d, bs, seqs = case
    k_cache, v_cache, tables, seq_lens, qsl, slots = build(rng, hk, d, bs, seqs)
    if kv == "bfloat16":
        k_cache, v_cache = to_bf16_bits(k_cache), to_bf16_bits(v_cache)
    longest = int(np.argmax(seq_lens))
    tables[longest, (int(seq_lens[longest]) - 1) // bs] = k_cache.shape[0]  # outside the cache
    t = slots.shape[0]
    q = (rng.standard_normal((t, hq, d)) * 2).astype(np.float32)
    args = (dev(q), dev(k_cache), dev(v_cache), dev(tables), dev(seq_lens), dev(qsl), d**-0.5)
    scratch = make_scratch(t, hq, d, int(seq_lens.max()) + 1)

    def run(mod):
        out = poisoned((t, hq, d))
        mod.decode_attention(*args, out, scratch)
        return host(out)

    want = run(attention_split)
    np.testing.assert_array_equal(run(attention_ring), want)
    monkeypatch.setattr(attention_ring, "TARGET_BLOCKS", 1)
    np.testing.assert_array_equal(run(attention_ring), want)
    rows = slice(int(qsl[longest]), int(qsl[longest + 1]))
    assert np.isnan(want[rows][-1]).all(), "the row that reaches the bad entry is unwritten"
    live = qsl[-1]
    assert not np.isnan(np.delete(want[:live], np.arange(live)[rows], axis=0)).any()


def test_decode_batches_of_min_rows_run_the_ring_kernel(rng, monkeypatch):
    """paged_attention with a scratch: the split kernel below RING_MIN_ROWS query rows, the
    ring kernel from there on; both match the reference."""
    ran = []
    for mod in (attention_split, attention_ring):
        monkeypatch.setattr(
            mod,
            "decode_attention",
            lambda *a, _mod=mod, _run=mod.decode_attention, **kw: (
                ran.append(_mod),
                _run(*a, **kw),
            ),
        )
    hq, hk, d, bs = 4, 2, 16, 4
    for rows, want in (
        (RING_MIN_ROWS - 1, attention_split),
        (RING_MIN_ROWS, attention_ring),
    ):
        k_cache, v_cache, tables, seq_lens, qsl, _ = build(rng, hk, d, bs, [(1, 9)] * rows, 0)
        q = rng.standard_normal((rows, hq, d)).astype(np.float32)
        out = poisoned((rows, hq, d))
        paged_attention(
            dev(q),
            dev(k_cache),
            dev(v_cache),
            dev(tables),
            dev(seq_lens),
            dev(qsl),
            0.25,
            out,
            scratch=make_scratch(rows, hq, d, 16),
        )
        assert ran.pop() is want and not ran
        ref = paged_attention_ref(q, k_cache, v_cache, tables, seq_lens, qsl, 0.25)
        np.testing.assert_allclose(host(out), ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
@pytest.mark.parametrize("head", [4, 6])
def test_a_step_longer_than_the_scratch_splits_its_rows_between_kernels(rng, kv, head, monkeypatch):
    """Decodes with prompts beside them and more rows than the scratch: its first rows go
    through the ring kernel (here one row ends mid-prompt), the rest through the prefill
    kernel: the reference, and the same bits as the prefill kernel alone."""
    hq, hk, d, bs = 4, 2, 16, 4
    seqs = [(1, 40), (1, 9), (1, 17), (5, 5), (3, 9), (1, 30)]
    k_cache, v_cache, tables, seq_lens, qsl, _ = build(rng, hk, d, bs, seqs)
    if kv == "bfloat16":
        k_cache, v_cache = to_bf16_bits(k_cache), to_bf16_bits(v_cache)
    t = int(qsl[-1]) + 2  # two padding rows
    q = (rng.standard_normal((t, hq, d)) * 2).astype(np.float32)
    meta = dev(tables), dev(seq_lens), dev(qsl)
    ran, launch = [], attention_ring._launch
    monkeypatch.setattr(
        attention_ring, "_launch", lambda *a: (ran.append(a[8].shape[0]), launch(*a))
    )

    def run(scratch):
        out = poisoned((t, hq, d))
        paged_attention(dev(q), dev(k_cache), dev(v_cache), *meta, d**-0.5, out, scratch=scratch)
        return host(out)

    got = run(make_scratch(head, hq, d, int(seq_lens.max()) + 1))
    assert ran == [head], "the ring kernel took the scratch's worth of leading rows"
    values = bf16_values if kv == "bfloat16" else np.asarray
    ref = paged_attention_ref(q, values(k_cache), values(v_cache), tables, seq_lens, qsl, d**-0.5)
    live = qsl[-1]
    np.testing.assert_allclose(got[:live], ref[:live], rtol=0, atol=2e-5)
    assert np.isnan(got[live:]).all(), "rows past every sequence must stay unwritten"
    np.testing.assert_array_equal(got, run(None))  # the prefill kernel for every row


def test_skips_inconsistent_sequences(rng):
    """Metadata is on the device, so bad sequences are skipped (left unwritten), not raised."""
    k_cache, v_cache, tables, seq_lens, qsl, _ = build(rng, 1, 8, 4, [(2, 6), (1, 3)], 0)
    tables[1, 0] = 99  # a block outside the cache
    q = rng.standard_normal((3, 1, 8)).astype(np.float32)
    out = poisoned((3, 1, 8))
    paged_attention(
        dev(q), dev(k_cache), dev(v_cache), dev(tables), dev(seq_lens), dev(qsl), 0.3, out
    )
    got = host(out)
    ref = paged_attention_ref(q[:2], k_cache, v_cache, tables[:1], seq_lens[:1], qsl[:2], 0.3)
    np.testing.assert_allclose(got[:2], ref[:2], atol=2e-5)
    assert np.isnan(got[2]).all()


def test_a_bad_entry_late_in_a_prompt_skips_only_the_rows_that_reach_it(rng):
    """Tokens of a prompt whose causal window ends before a bad block-table entry are
    computed; later ones stay unwritten; the prefill kernel (several tokens per block) and the
    decode kernel (one per block) agree bit for bit."""
    k_cache, v_cache, tables, seq_lens, qsl, _ = build(rng, 2, 8, 4, [(7, 10), (3, 3)], 0)
    tables[0, 2] = -1  # keys 8.. of sequence 0: its last two tokens (windows of 9, 10 keys)
    q = rng.standard_normal((10, 4, 8)).astype(np.float32)
    meta = (dev(tables), dev(seq_lens), dev(qsl))
    outs = []
    for scratch in (None, make_scratch(10, 4, 8, 16)):
        out = poisoned((10, 4, 8))
        paged_attention(dev(q), dev(k_cache), dev(v_cache), *meta, 0.3, out, scratch=scratch)
        outs.append(host(out))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert np.isnan(outs[0][5:7]).all() and not np.isnan(outs[0][:5]).any()
    ref = paged_attention_ref(q[7:], k_cache, v_cache, tables[1:], seq_lens[1:], qsl[1:] - 7, 0.3)
    np.testing.assert_allclose(outs[0][7:], ref, atol=2e-5)


def test_rejects_bad_shapes(rng):
    q = dev(np.ones((2, 3, 8), np.float32))
    cache = dev(np.ones((4, 4, 2, 8), np.float32))
    meta = (
        dev(np.zeros((1, 2), np.int32)),
        dev(np.ones(1, np.int32)),
        dev(np.array([0, 1], np.int32)),
    )
    with pytest.raises(ValueError, match="shapes do not match"):  # Hq % Hk != 0
        paged_attention(q, cache, cache, *meta, 1.0, poisoned((2, 3, 8)))
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv(
            dev(np.ones((2, 2, 8), np.float32)),
            dev(np.ones((2, 2, 8), np.float32)),
            cache,
            cache,
            dev(np.zeros(3, np.int32)),
        )
    q2 = dev(np.ones((2, 2, 8), np.float32))
    with pytest.raises(ValueError, match="float32 or uint16"):  # a cache of another dtype
        half = dev(np.ones((4, 4, 2, 8), np.float16))
        paged_attention(q2, half, half, *meta, 1.0, poisoned((2, 2, 8)))
    with pytest.raises(ValueError, match="v_cache must be"):  # k and v of different dtypes
        bits = dev(np.ones((4, 4, 2, 8), np.uint16))
        paged_attention(q2, cache, bits, *meta, 1.0, poisoned((2, 2, 8)))
