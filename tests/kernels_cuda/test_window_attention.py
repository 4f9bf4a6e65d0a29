"""Sliding-window and soft-capped attention on the device vs the float64 reference: prompt
rows, a chunk, decode rows, GQA, both cache types; a token's row has the same bits whether it
comes in a whole prompt, a chunk or a decode step; qkv_attention takes the window on one-token
steps too (where the plain path would rotate inside attention)."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import dev, host, poisoned
from tests.kernels_cuda.test_attention import bf16_values, build
from vtllm.kernels.cuda import paged_attention
from vtllm.kernels.cuda.attention import make_scratch, qkv_attention
from vtllm.kernels.reference import paged_attention_ref, rotary_ref, write_kv_ref
from vtllm.kernels.rope_table import rope_cos_sin
from vtllm.models.synthetic import to_bf16_bits

pytestmark = pytest.mark.cudasim

HQ, HK, D, BS = 4, 2, 16, 4
# (new tokens, context) per sequence: a prompt past the window, a chunk, a decode, padding
SEQS = [(12, 12), (3, 14), (1, 19), (0, 0)]


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
@pytest.mark.parametrize("window,cap", [(5, 0.0), (0, 1.5), (6, 2.0)], ids=str)
def test_matches_reference(rng, window, cap, kv):
    k_cache, v_cache, tables, seq_lens, qsl, slots = build(rng, HK, D, BS, SEQS)
    values = k_cache, v_cache
    if kv == "bfloat16":
        k_cache, v_cache = to_bf16_bits(k_cache), to_bf16_bits(v_cache)
        values = bf16_values(k_cache), bf16_values(v_cache)
    t = slots.shape[0]
    q = (rng.standard_normal((t, HQ, D)) * 2).astype(np.float32)  # scores over the cap
    meta = dev(tables), dev(seq_lens), dev(qsl)
    scratch = make_scratch(t, HQ, D, int(seq_lens.max()) + 1)
    out = poisoned((t, HQ, D))
    kc, vc = dev(k_cache), dev(v_cache)
    paged_attention(dev(q), kc, vc, *meta, 0.3, out, scratch=scratch, window=window, softcap=cap)
    got = host(out)
    ref = paged_attention_ref(q, *values, tables, seq_lens, qsl, 0.3, window, cap)
    live = qsl[-1]
    np.testing.assert_allclose(got[:live], ref[:live], rtol=0, atol=2e-5)
    assert np.isnan(got[live:]).all(), "rows past every sequence must stay unwritten"
    plain = paged_attention_ref(q, *values, tables, seq_lens, qsl, 0.3)
    assert np.abs(plain[:live] - ref[:live]).max() > 1e-2, "the window or cap must bite"


def test_a_rows_bits_do_not_depend_on_its_step(rng):
    """One sequence of 11 tokens attended as a whole prompt, as chunks of 4 + 7, and token by
    token (decode steps beside another sequence's rows): every row the same bits."""
    n, window, cap = 11, 4, 1.5
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
            scratch=make_scratch(other + count, HQ, D, n + 1),
            window=window,
            softcap=cap,
        )
        return host(out)[other:]

    whole = rows(0, n)
    np.testing.assert_array_equal(np.concatenate([rows(0, 4), rows(4, 7)]), whole)
    decode = np.concatenate([rows(i, 1, other=1) for i in range(n)])
    np.testing.assert_array_equal(decode, whole)


@pytest.mark.parametrize("tokens", [1, 3])
def test_qkv_attention_takes_the_window_on_every_step_size(rng, tokens):
    """The fused projection through qkv_attention with a window and a cap: q and k rotated,
    the new keys written, then windowed attention; one-token steps included."""
    ctx, window, cap = 10, 4, 2.0
    k_cache, v_cache, tables, seq_lens, qsl, slots = build(rng, HK, D, BS, [(tokens, ctx)], 0)
    qkv = rng.standard_normal((tokens, (HQ + 2 * HK) * D)).astype(np.float32)
    positions = np.arange(ctx - tokens, ctx, dtype=np.int32)
    cos_sin = rope_cos_sin(ctx + 1, D, 10000.0)
    kc, vc = dev(k_cache), dev(v_cache)
    out = poisoned((tokens, HQ, D))
    qkv_attention(
        dev(qkv),
        poisoned((tokens, HQ, D)),
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
        make_scratch(tokens, HQ, D, ctx + 1),
        window=window,
        softcap=cap,
    )
    q = qkv[:, : HQ * D].reshape(tokens, HQ, D)
    k = qkv[:, HQ * D : (HQ + HK) * D].reshape(tokens, HK, D)
    v = qkv[:, (HQ + HK) * D :].reshape(tokens, HK, D)
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
