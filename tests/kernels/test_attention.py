"""write_kv and paged_attention vs the references, and the law that makes chunked prefill and
prefix caching output-neutral: a query's output has the same bits whether it is computed in a
full prefill, in a chunk of any size, as a decode step, next to any other sequences, on any
number of threads."""

import numpy as np
import pytest

from vtllm.kernels.cpu.attention import paged_attention, write_kv
from vtllm.kernels.reference import paged_attention_ref, write_kv_ref

BS, NB = 16, 24


def cache(rng, hk, d):
    """Caches full of garbage: only slots a sequence owns may matter."""
    return tuple(rng.standard_normal((NB, BS, hk, d)).astype(np.float32) for _ in range(2))


def tables(rng, rows, width=6):
    """Block tables of distinct, shuffled block ids, padded past the used ones with junk."""
    ids = rng.permutation(NB)[: rows * width].reshape(rows, width).astype(np.int32)
    return ids


def attend(q, kc, vc, bt, seq_lens, qsl, scale):
    out = np.full_like(q, np.nan)
    paged_attention(
        q,
        kc,
        vc,
        np.asarray(bt, np.int32),
        np.asarray(seq_lens, np.int32),
        np.asarray(qsl, np.int32),
        scale,
        out,
    )
    return out


def test_write_kv(rng):
    kc, vc = cache(rng, 2, 32)
    k = rng.standard_normal((5, 2, 32)).astype(np.float32)
    v = rng.standard_normal((5, 2, 32)).astype(np.float32)
    slots = np.array([0, -1, 17, NB * BS - 1, 40], np.int32)
    want_k, want_v = write_kv_ref(k, v, kc, vc, slots)
    write_kv(k, v, kc, vc, slots)
    assert np.array_equal(kc, want_k) and np.array_equal(vc, want_v)
    before = kc.copy()
    for bad in ([0, 1, 2, 3, NB * BS], [0, -2, 1, 2, 3]):
        with pytest.raises(ValueError):
            write_kv(k, v, kc, vc, np.array(bad, np.int32))
    assert np.array_equal(kc, before)  # validated before anything is written


@pytest.mark.parametrize("hq,hk,d", [(6, 2, 64), (4, 4, 40), (9, 3, 16)])
def test_matches_reference(rng, hq, hk, d):
    kc, vc = cache(rng, hk, d)
    bt = tables(rng, 4)
    # a prefill chunk after cached context, a decode, a full prefill, a sequence with no rows
    seq_lens, n_new = [50, 33, 20, 9], [13, 1, 20, 0]
    qsl = np.r_[0, np.cumsum(n_new)]
    q = (rng.standard_normal((qsl[-1], hq, d)) * 2).astype(np.float32)
    scale = d**-0.5
    out = attend(q, kc, vc, bt, seq_lens, qsl, scale)
    ref = paged_attention_ref(q, kc, vc, bt, seq_lens, qsl, scale)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=2e-6)


def test_chunking_is_bitwise_neutral(rng, threads):
    hq, hk, d, n = 9, 3, 64, 40
    k = rng.standard_normal((n, hk, d)).astype(np.float32)
    v = rng.standard_normal((n, hk, d)).astype(np.float32)
    q = (rng.standard_normal((n, hq, d)) * 2).astype(np.float32)
    bt = tables(rng, 2, 4)  # row 0: our sequence; row 1: a neighbour
    kc, vc = cache(rng, hk, d)
    pos = np.arange(n)
    write_kv(k, v, kc, vc, (bt[0][pos // BS] * BS + pos % BS).astype(np.int32))
    other = rng.standard_normal((5, hq, d)).astype(np.float32)  # neighbour: 5 queries at 20..24

    with threads(2):
        whole = attend(q, kc, vc, bt[:1], [n], [0, n], 0.125)
    np.testing.assert_allclose(
        whole, paged_attention_ref(q, kc, vc, bt[:1], [n], [0, n], 0.125), rtol=1e-5, atol=2e-6
    )
    for step in (7, 1):
        for nthreads in (1, 2):
            with threads(nthreads):
                for lo in range(0, n, step):
                    hi = min(n, lo + step)
                    alone = attend(q[lo:hi], kc, vc, bt[:1], [hi], [0, hi - lo], 0.125)
                    assert np.array_equal(alone, whole[lo:hi]), (step, lo)
                    # the same chunk behind a neighbour's rows in one batch
                    both = attend(
                        np.concatenate([other, q[lo:hi]]),
                        kc,
                        vc,
                        bt[::-1].copy(),
                        [24, hi],
                        [0, 5, 5 + hi - lo],
                        0.125,
                    )
                    assert np.array_equal(both[5:], whole[lo:hi]), (step, lo)


def test_rows_outside_sequences_untouched(rng):
    kc, vc = cache(rng, 1, 16)
    q = rng.standard_normal((4, 2, 16)).astype(np.float32)
    out = attend(q, kc, vc, tables(rng, 1), [10], [0, 2], 0.25)
    assert np.isnan(out[2:]).all() and not np.isnan(out[:2]).any()


def test_bad_inputs(rng):
    kc, vc = cache(rng, 2, 16)
    q = rng.standard_normal((3, 4, 16)).astype(np.float32)
    bt = tables(rng, 2, 2)
    ok = (q, kc, vc, bt, np.array([5, 20], np.int32), np.array([0, 2, 3], np.int32))
    attend(*ok, 0.25)
    i32 = lambda *a: np.array(a, np.int32)  # noqa: E731
    for i, bad in [
        (0, q.astype(np.float64)),
        (0, rng.standard_normal((3, 3, 16)).astype(np.float32)),  # Hq not a multiple of Hk
        (1, kc[:, :, :, :8].copy()),
        (2, vc[:-1]),
        (3, bt.astype(np.int64)),
        (3, bt[:1]),
        (3, i32([0, 1], [NB, 2])),  # block id out of range
        (3, i32([0], [1])),  # 20 tokens need 2 blocks
        (4, i32(1, 20)),  # seq_len smaller than its queries
        (4, i32(5)),
        (5, i32(0, 2, 4)),  # rows past T
        (5, i32(0, 3, 2)),  # descending
        (5, i32(0, 3)),
    ]:
        args = list(ok)
        args[i] = bad
        with pytest.raises(ValueError):
            paged_attention(*args, 0.25, np.empty(args[0].shape, np.float32))
    with pytest.raises(ValueError):
        paged_attention(*ok, 0.25, np.empty((3, 4, 8), np.float32))


def test_block_size_does_not_change_bits(rng):
    """16-key groups (block_size % 16 == 0) and the one-key-at-a-time path agree to the bit."""
    hq, hk, d, n = 4, 2, 48, 45
    k = rng.standard_normal((n, hk, d)).astype(np.float32)
    v = rng.standard_normal((n, hk, d)).astype(np.float32)
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    outs = []
    for bs in (16, 8, 5):
        kc = rng.standard_normal((64, bs, hk, d)).astype(np.float32)
        vc = rng.standard_normal((64, bs, hk, d)).astype(np.float32)
        bt = rng.permutation(64)[None, : -(-n // bs)].astype(np.int32)
        pos = np.arange(n)
        write_kv(k, v, kc, vc, (bt[0][pos // bs] * bs + pos % bs).astype(np.int32))
        outs.append(attend(q, kc, vc, bt, [n], [0, n], 0.2))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


def test_read_only_inputs(rng):
    kc, vc = cache(rng, 2, 16)
    q = rng.standard_normal((3, 4, 16)).astype(np.float32)
    args = [q, kc, vc, tables(rng, 1, 2), np.array([20], np.int32), np.array([0, 3], np.int32)]
    want = attend(*args, 0.25)
    for a in args:
        a.flags.writeable = False
    assert np.array_equal(attend(*args, 0.25), want)
    k = rng.standard_normal((1, 2, 16)).astype(np.float32)
    slots = np.array([5], np.int32)
    k.flags.writeable = slots.flags.writeable = False
    kc2, vc2 = cache(rng, 2, 16)
    write_kv(k, k, kc2, vc2, slots)
    assert np.array_equal(kc2[0, 5], k[0])
