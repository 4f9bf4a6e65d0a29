"""Sliding-window and soft-capped attention on the device vs the float64 reference, through every
kernel of the exact family (the split, ring and prefill kernels, and rope_attention for one-token
steps): a token's row gets the same bits on every path, in a decode step, a prompt chunk or a
whole prompt. The windows cut rows at a split's first key, inside and at the edge of a KV block,
inside a split, and are shorter than, equal to and longer than the row's context."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from tests.kernels_cuda.test_attention import bf16_values, build
from vtllm.kernels.cuda import _attention_ring as attention_ring
from vtllm.kernels.cuda import _attention_split as attention_split
from vtllm.kernels.cuda import paged_attention
from vtllm.kernels.cuda.attention import make_scratch, qkv_attention
from vtllm.kernels.reference import paged_attention_ref, rotary_ref, write_kv_ref
from vtllm.kernels.rope_table import rope_cos_sin
from vtllm.models.synthetic import to_bf16_bits

pytestmark = pytest.mark.cudasim

HQ, HK, D, BS, WINDOW = 2, 1, 8, 4, 20
# (new tokens, context): with WINDOW 20 the rows' first keys are 32 (a split's first key and a
# block's), 33 .. 35 (inside a block, the split before empty) | 25 (inside a block, the window
# across two splits) | 24 (a block's first key inside a split) | 0: windows longer than (18,
# 19), equal to (20) and longer than (12) the context; then padding
SEQS = [(4, 55), (1, 45), (1, 44), (3, 20), (1, 12), (0, 0)]


def every_path(rng, hq, hk, d, bs, seqs, kv, **masks):
    """(out of the prefill kernel, of the split kernel, of the ring kernel, the float64
    reference, the reference without window and cap, rows in sequences) for one random step
    of seqs; the decode kernels take every row, each spread over blocks. With a window, the
    blocks before each sequence's first window are the null block of freed ones
    (scheduler/sliding_window), here full of NaN: no kernel may weigh its values, not even
    by p = 0."""
    k_cache, v_cache, tables, seq_lens, qsl, slots = build(rng, hk, d, bs, seqs, 1)
    if masks["window"]:
        null = np.full((1, bs, hk, d), np.nan, np.float32)
        k_cache, v_cache = np.concatenate([k_cache, null]), np.concatenate([v_cache, null])
        for s, (n, ctx) in enumerate(seqs):
            tables[s, : max(0, ctx - n + 1 - masks["window"]) // bs] = k_cache.shape[0] - 1
    values = k_cache, v_cache
    if kv == "bfloat16":
        k_cache, v_cache = to_bf16_bits(k_cache), to_bf16_bits(v_cache)
        values = bf16_values(k_cache), bf16_values(v_cache)
    t = slots.shape[0]
    q = (rng.standard_normal((t, hq, d)) * 2).astype(np.float32)  # scores past the cap
    args = (dev(q), dev(k_cache), dev(v_cache), dev(tables), dev(seq_lens), dev(qsl), d**-0.5)
    scratch = make_scratch(t, hq, d, int(seq_lens.max()) + 1)
    outs = []
    for path in ("prefill", "split", "ring"):
        out = poisoned((t, hq, d))
        if path == "prefill":
            paged_attention(*args, out, **masks)
        else:
            mod = attention_split if path == "split" else attention_ring
            mod.decode_attention(*args, out, scratch, **masks)
        outs.append(host(out))
    meta = (tables, seq_lens, qsl, d**-0.5)
    ref = paged_attention_ref(q, *values, *meta, masks["window"], masks["softcap"])
    plain = paged_attention_ref(q, *[np.nan_to_num(v) for v in values], *meta)
    return *outs, ref, plain, int(qsl[-1])


def check_every_path(rng, hq, hk, d, bs, seqs, kv, window, cap, monkeypatch):
    """every_path's outputs: the reference within float32 noise, the same bits on each path,
    padding rows unwritten, and a mask that changes the result."""
    monkeypatch.setattr(attention_ring, "TARGET_BLOCKS", 1)
    masks = {"window": window, "softcap": cap}
    prefill, split, ring, ref, plain, live = every_path(rng, hq, hk, d, bs, seqs, kv, **masks)
    np.testing.assert_allclose(prefill[:live], ref[:live], rtol=0, atol=2e-5)
    if window or cap:
        assert np.abs(plain[:live] - ref[:live]).max() > 1e-2, "the window or cap must bite"
    np.testing.assert_array_equal(split, prefill)
    np.testing.assert_array_equal(ring, prefill)
    assert np.isnan(prefill[live:]).all(), "rows past every sequence must stay unwritten"


@pytest.mark.parametrize(
    ("window", "cap", "kv"),
    [(WINDOW, 0.0, "float32"), (0, 1.5, "bfloat16"), (WINDOW, 2.0, "bfloat16")],
    ids=str,
)
def test_every_path_matches_the_reference_with_the_same_bits(rng, window, cap, kv, monkeypatch):
    check_every_path(rng, HQ, HK, D, BS, SEQS, kv, window, cap, monkeypatch)


if not SIMULATOR:

    @pytest.mark.parametrize("kv", ["float32", "bfloat16"])
    @pytest.mark.parametrize("d", [128, 256])
    def test_model_shapes_on_every_path(rng, d, kv, monkeypatch):
        """Gemma-like heads (8 over 4) at 128 and 256 dims, blocks of 16, a window of 300
        over contexts past it, and a prompt beside them."""
        seqs = [(1, 1000), (1, 301), (1, 44), (200, 700), (0, 0)]
        check_every_path(rng, 8, 4, d, 16, seqs, kv, 300, 50.0, monkeypatch)


def test_a_rows_bits_do_not_depend_on_its_step(rng):
    """One sequence of 40 tokens attended as a whole prompt, as chunks of 33 + 7 (the
    prefill kernel), and its last tokens one by one (decode steps beside another sequence's
    row: the split kernel): every row the same bits."""
    n, window, cap = 40, 6, 1.5
    k_cache, v_cache, tables, _, _, _ = build(rng, HK, D, BS, [(n, n)])
    q = (rng.standard_normal((n, HQ, D)) * 2).astype(np.float32)
    kc, vc, table = dev(k_cache), dev(v_cache), tables[:1]

    def rows(first, count, other=0):
        """Rows first .. first + count of the sequence, after `other` rows of a 1-key one."""
        qs = np.concatenate([rng.standard_normal((other, HQ, D)), q[first : first + count]])
        bt = np.concatenate([table] * 2) if other else table
        lens = np.array(([1] if other else []) + [first + count], np.int32)
        qsl = np.array([0, other, other + count] if other else [0, count], np.int32)
        out = poisoned((other + count, HQ, D))
        paged_attention(
            dev(qs.astype(np.float32)),
            kc,
            vc,
            dev(bt),
            dev(lens),
            dev(qsl),
            0.3,
            out,
            scratch=make_scratch(other + count, HQ, D, n + 1) if other else None,
            window=window,
            softcap=cap,
        )
        return host(out)[other:]

    whole = rows(0, n)
    np.testing.assert_array_equal(np.concatenate([rows(0, 33), rows(33, 7)]), whole)
    decode = np.concatenate([rows(i, 1, other=1) for i in (33, 38, 39)])
    np.testing.assert_array_equal(decode, whole[[33, 38, 39]])


@pytest.mark.parametrize("tokens", [1, 3])
def test_qkv_attention_takes_the_window_on_every_step_size(rng, tokens):
    """The fused projection through qkv_attention with a window and a cap: q and k rotated,
    the new keys written, then windowed attention; one-token steps rotate inside attention
    (rope_attention), their window past the first split."""
    d, ctx, window, cap = 32, 40, 6, 2.0
    k_cache, v_cache, tables, seq_lens, qsl, slots = build(rng, HK, d, BS, [(tokens, ctx)], 0)
    qkv = rng.standard_normal((tokens, (HQ + 2 * HK) * d)).astype(np.float32)
    positions = np.arange(ctx - tokens, ctx, dtype=np.int32)
    cos_sin = rope_cos_sin(ctx + 1, d, 10000.0)
    kc, vc = dev(k_cache), dev(v_cache)
    out = poisoned((tokens, HQ, d))
    qkv_attention(
        dev(qkv),
        poisoned((tokens, HQ, d)),
        kc,
        vc,
        dev(slots),
        dev(positions),
        dev(cos_sin),
        1e-6,
        dev(tables),
        dev(seq_lens),
        dev(qsl),
        0.3,
        out,
        make_scratch(tokens, HQ, d, ctx + 1),
        window=window,
        softcap=cap,
    )
    q = qkv[:, : HQ * d].reshape(tokens, HQ, d)
    k = qkv[:, HQ * d : (HQ + HK) * d].reshape(tokens, HK, d)
    v = qkv[:, (HQ + HK) * d :].reshape(tokens, HK, d)
    q, k = rotary_ref(q, k, positions, cos_sin)
    ref_kc, ref_vc = write_kv_ref(k, v, k_cache, v_cache, slots)
    ref = paged_attention_ref(q, ref_kc, ref_vc, tables, seq_lens, qsl, 0.3, window, cap)
    np.testing.assert_allclose(host(out), ref, rtol=0, atol=5e-5)


def test_rejects_a_negative_window_or_cap():
    k_cache, v_cache, tables, seq_lens, qsl, _ = build(np.random.default_rng(0), HK, D, BS, SEQS)
    args = [dev(a) for a in (k_cache, v_cache, tables, seq_lens, qsl)]
    q = dev(np.ones((qsl[-1], HQ, D), np.float32))
    for kw in ({"window": -1}, {"softcap": -1.0}):
        with pytest.raises(ValueError, match="must be >= 0"):
            paged_attention(q, *args, 0.3, poisoned((qsl[-1], HQ, D)), **kw)
