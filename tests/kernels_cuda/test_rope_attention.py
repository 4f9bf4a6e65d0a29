"""rope_attention (qkv_rope and split attention in one kernel) against the two kernels it
replaces, run on the same inputs: the same out, k cache and v cache bits, for decode steps,
padding, a block looping over several splits, and the rows it must leave alone."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from tests.kernels_cuda.test_attention import bf16_values
from vtllm.kernels.cuda import _attention_ring as attention_ring
from vtllm.kernels.cuda import _attention_split as attention_split
from vtllm.kernels.cuda import paged_attention
from vtllm.kernels.cuda.attention import fuses_rope, make_scratch, qkv_rope, rope_attention
from vtllm.kernels.reference import paged_attention_ref
from vtllm.models.synthetic import to_bf16_bits

pytestmark = pytest.mark.cudasim

# (Hq, Hk, D, q/k norms)
SHAPES = [(4, 2, 32, True), (2, 1, 64, False), (8, 2, 32, False)]  # the last: G = WARPS
if not SIMULATOR:
    SHAPES += [(16, 8, 128, True), (32, 8, 128, False)]
BS, MAX_POS = 16, 256


def decode_step(rng, hk, d, contexts, kv):
    """A cache over shuffled blocks and a step of one new token per sequence (context c: the
    new token sits at position c - 1), then two padding rows (slot -1, in no sequence)."""
    need = [-(-c // BS) for c in contexts]
    num_blocks = sum(need) + 2
    pool = rng.permutation(num_blocks).astype(np.int32)
    tables = np.full((len(contexts), max(need) + 1), -1, np.int32)
    slots, start = [], 0
    for s, c in enumerate(contexts):
        tables[s, : need[s]] = pool[start : start + need[s]]
        start += need[s]
        slots.append(tables[s, (c - 1) // BS] * BS + (c - 1) % BS)
    k_cache = rng.standard_normal((num_blocks, BS, hk, d)).astype(np.float32)
    v_cache = rng.standard_normal((num_blocks, BS, hk, d)).astype(np.float32)
    if kv == "bfloat16":
        k_cache, v_cache = to_bf16_bits(k_cache), to_bf16_bits(v_cache)
    n = len(contexts)
    meta = {
        "slot_mapping": np.array(slots + [-1, -1], np.int32),
        "positions": np.array([c - 1 for c in contexts] + [0, 0], np.int32),
        "block_tables": tables,
        "seq_lens": np.array(contexts, np.int32),
        "query_start_loc": np.array(list(range(n + 1)), np.int32),
    }
    return k_cache, v_cache, meta


def both_ways(
    rng, hq, hk, d, norm, k_cache, v_cache, meta, fused_by=attention_split, rotated=None, **masks
):
    """(out, k cache, v cache) from qkv_rope + paged_attention and from rope_attention (that
    of the module fused_by), on one random qkv, rope table and norm weights; masks: window
    and softcap for both; rotated: a list that receives qkv_rope's q."""
    t = meta["slot_mapping"].shape[0]
    qkv = rng.standard_normal((t, (hq + 2 * hk) * d)).astype(np.float32)
    cos_sin = rng.uniform(-1, 1, (MAX_POS, d)).astype(np.float32)
    norms = {}
    if norm:
        norms = {
            "q_norm": dev(rng.uniform(0.5, 1.5, d).astype(np.float32)),
            "k_norm": dev(rng.uniform(0.5, 1.5, d).astype(np.float32)),
        }
    m = {name: dev(a) for name, a in meta.items()}
    scratch = make_scratch(t, hq, d, MAX_POS)
    scale, eps = d**-0.5, 1e-6
    results = []
    for fused in (False, True):
        kc, vc, out = dev(k_cache), dev(v_cache), poisoned((t, hq, d))
        if fused:
            fused_by.rope_attention(
                dev(qkv),
                kc,
                vc,
                m["slot_mapping"],
                m["positions"],
                dev(cos_sin),
                eps,
                m["block_tables"],
                m["seq_lens"],
                m["query_start_loc"],
                scale,
                out,
                scratch,
                **norms,
                **masks,
            )
        else:
            q = poisoned((t, hq, d))
            qkv_rope(
                dev(qkv), q, kc, vc, m["slot_mapping"], m["positions"], dev(cos_sin), eps, **norms
            )
            paged_attention(
                q,
                kc,
                vc,
                m["block_tables"],
                m["seq_lens"],
                m["query_start_loc"],
                scale,
                out,
                scratch=scratch,
                **masks,
            )
            if rotated is not None:
                rotated.append(host(q))
        results.append((host(out), host(kc), host(vc)))
    return results


MODULES = {"split": attention_split, "ring": attention_ring}
KVS, TARGETS = ("float32", "bfloat16"), ("default", 1)
if SIMULATOR:  # any two factors meet in each pair of their values (~40 s a case there)
    CASES = [(0, "split", 0, 0), (0, "ring", 1, 1), (1, "split", 1, 1), (1, "ring", 0, 0)]
    CASES += [(2, "split", 0, 1), (2, "ring", 1, 0)]
else:
    CASES = [
        (s, m, kv, t) for s in range(len(SHAPES)) for m in MODULES for kv in (0, 1) for t in (0, 1)
    ]
CASES = [(SHAPES[s], KVS[kv], TARGETS[t], m) for s, m, kv, t in CASES]


@pytest.mark.parametrize(
    ("shape", "kv", "target", "module"),
    [(shape, kv, target, MODULES[m]) for shape, kv, target, m in CASES],
    ids=[f"hq{s[0]}-hk{s[1]}-d{s[2]}-norm{s[3]}-{kv}-{t}-{m}" for s, kv, t, m in CASES],
)
def test_same_bits_as_qkv_rope_then_attention(rng, shape, kv, target, module, monkeypatch):
    """target 1: one block per row and kv head, so the block that writes the new key has
    looped over the row's other splits first."""
    if target != "default":
        monkeypatch.setattr(module, "TARGET_BLOCKS", target)
    hq, hk, d, norm = shape
    contexts = [1, 33, 130]  # the new key alone; first of a second split; in the fifth
    k_cache, v_cache, meta = decode_step(rng, hk, d, contexts, kv)
    (out, kc, vc), (f_out, f_kc, f_vc) = both_ways(
        rng, hq, hk, d, norm, k_cache, v_cache, meta, module
    )
    np.testing.assert_array_equal(f_kc, kc)
    np.testing.assert_array_equal(f_vc, vc)
    np.testing.assert_array_equal(f_out, out)
    assert not np.isnan(out[:3]).any(), "every sequence's row is written"
    assert np.isnan(f_out[3:]).all(), "padding rows stay unwritten"
    assert (kc != k_cache).any(), "the new keys were written"


@pytest.mark.parametrize(
    ("kv", "module"),
    [("float32", attention_split), ("bfloat16", attention_ring)],
    ids=["float32-split", "bfloat16-ring"],
)
def test_window_and_cap_keep_the_two_kernels_bits(rng, kv, module):
    """A window of 38 keys: the new token's window starts at a split's first key (the split
    before it empty, never visited), inside the first split, and covers a shorter context;
    scores capped. qkv_rope + paged_attention take the step through the ring kernel (five
    rows with the padding): the same out and cache bits, and the reference's out."""
    hq, hk, d, norm, window, cap = 2, 1, 32, True, 38, 1.5
    k_cache, v_cache, meta = decode_step(rng, hk, d, [20, 40, 70], kv)
    q = []
    (out, kc, vc), (f_out, f_kc, f_vc) = both_ways(
        rng, hq, hk, d, norm, k_cache, v_cache, meta, module, q, window=window, softcap=cap
    )
    np.testing.assert_array_equal(f_kc, kc)
    np.testing.assert_array_equal(f_vc, vc)
    np.testing.assert_array_equal(f_out, out)
    assert np.isnan(f_out[3:]).all(), "padding rows stay unwritten"
    values = bf16_values if kv == "bfloat16" else np.asarray
    m = [meta[name] for name in ("block_tables", "seq_lens", "query_start_loc")]
    args = (q[0][:3], values(kc), values(vc), *m, d**-0.5)
    ref = paged_attention_ref(*args, window, cap)
    np.testing.assert_allclose(f_out[:3], ref, rtol=0, atol=2e-5)
    assert np.abs(paged_attention_ref(*args)[1:] - ref[1:]).max() > 1e-2, "masks must bite"


@pytest.mark.parametrize("module", [attention_split, attention_ring], ids=["split", "ring"])
def test_leaves_rows_it_cannot_serve_unwritten(rng, module):
    """A sequence with two new tokens (its second key would come from another block) and one
    whose block table points outside the cache: their rows stay unwritten; the other rows
    keep the two kernels' bits, and the bad sequence's new key is still written, as qkv_rope
    writes it."""
    hq, hk, d, norm = SHAPES[0]
    k_cache, v_cache, meta = decode_step(rng, hk, d, [50, 20, 90], "float32")
    # sequence 0 now has two new tokens: rows 0 and 1 (positions 48, 49); rows 2, 3 follow
    meta["query_start_loc"] = np.array([0, 2, 3, 4], np.int32)
    tables = meta["block_tables"]
    slot48 = tables[0, 48 // BS] * BS + 48 % BS
    meta["slot_mapping"] = np.concatenate([[slot48], meta["slot_mapping"][:4]]).astype(np.int32)
    meta["positions"] = np.concatenate([[48], meta["positions"][:4]]).astype(np.int32)
    tables[2, 1] = k_cache.shape[0] + 5  # sequence 2 (row 3): keys 16.. outside the cache
    (out, kc, vc), (f_out, f_kc, f_vc) = both_ways(
        rng, hq, hk, d, norm, k_cache, v_cache, meta, module
    )
    assert np.isnan(f_out[[0, 1, 3, 4]]).all()
    np.testing.assert_array_equal(f_out[2], out[2])
    for row in (2, 3):  # the one-token sequences' new keys, written by both
        blk, off = divmod(int(meta["slot_mapping"][row]), BS)
        np.testing.assert_array_equal(f_kc[blk, off], kc[blk, off])
        np.testing.assert_array_equal(f_vc[blk, off], vc[blk, off])


def test_rejects_what_it_cannot_take(rng):
    hq, hk, d = 2, 1, 32
    k_cache, v_cache, meta = decode_step(rng, hk, d, [5], "float32")
    m = {name: dev(a) for name, a in meta.items()}
    t = meta["slot_mapping"].shape[0]
    qkv, cos_sin = (
        dev(np.ones((t, (hq + 2 * hk) * d), np.float32)),
        dev(np.ones((8, d), np.float32)),
    )
    kc, vc = dev(k_cache), dev(v_cache)
    fits = make_scratch(t, hq, d, 64)

    def call(qkv=qkv, scratch=fits, out=None):
        rope_attention(
            qkv,
            kc,
            vc,
            m["slot_mapping"],
            m["positions"],
            cos_sin,
            1e-6,
            m["block_tables"],
            m["seq_lens"],
            m["query_start_loc"],
            0.1,
            poisoned((t, hq, d)) if out is None else out,
            scratch,
        )

    with pytest.raises(ValueError, match="scratch"):
        call(scratch=None)
    with pytest.raises(ValueError, match="scratch"):
        call(scratch=make_scratch(t - 1, hq, d, 64))
    with pytest.raises(ValueError, match="do not fit"):
        call(qkv=dev(np.ones((t, hq * d), np.float32)))
    with pytest.raises(ValueError, match="shapes do not match"):
        call(out=poisoned((t, hq, d // 2)))
    assert fuses_rope(16, 8, 128) and fuses_rope(4, 2, 64)
    assert not fuses_rope(4, 2, 96) and not fuses_rope(4, 2, 48) and not fuses_rope(32, 2, 128)
