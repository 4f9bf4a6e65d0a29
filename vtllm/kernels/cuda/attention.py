"""Attention over the paged KV cache on the GPU, and which kernel runs when. Hot path: keep it
lean.

Same metadata as the CPU kernels (block_tables, seq_lens, query_start_loc). Metadata lives on
the device, so launchers check only dtypes and shapes; the kernels skip what is out of range
instead of raising: rows of q outside every sequence, and sequences whose lengths or
block-table entries do not fit (left unwritten).

qkv_attention, the forward's attention (q/k norm, rotary, the KV write, then attention):
  - steps of up to ROPE_TOKENS tokens on shapes that fuses_rope takes: rope_attention, all of
    it in the split kernel (_attention_split) and its combine. Such steps have one token per
    sequence whatever they are (a captured graph serves decode, prefill and mixed steps of its
    size alike), so each block can make its own q and the newest key;
  - other steps: qkv_rope (_qkv_rope, one kernel), then paged_attention.
paged_attention:
  - shapes the split kernels take (_attention_common.supports: head_dim <= 128 and a multiple
    of 4, or 256; Hq / Hk <= 8), unless split=False:
      - rows that fit the scratch (decode steps): each row's keys spread over blocks, the
        split states folded by the combine; the ring kernel (_attention_ring) from
        RING_MIN_ROWS rows on, the split kernel (_attention_split) below;
      - more rows than the scratch holds (a prefill, or decodes with prompt chunks beside
        them): from RING_MIN_ROWS rows on, the scratch's worth of leading rows through the ring
        kernel (the scheduler puts decode rows first), and the rest through the prefill kernel
        (_attention_prefill), or, with flash (opt-in), the flash kernel (_attention_flash)
        where it takes the cache and shape and the layer has neither window nor cap;
  - other shapes: the general kernel (_attention_paged), one block per (token, head).
Every path but the flash kernel gives a token's row the same bits, whatever the step's size,
its other rows or the chunking (the depth-2 law needs that on the GPU too).

A sliding window or a score soft-cap (Gemma; Mistral and Phi-3 with a window) takes the same
routes: each kernel of the family has a masked variant (_attention_common says how a window
empties a row's leading splits and why every path still folds the same states), compiled apart
from the plain one, so the layers without either run the code they ran before. Heads of 256
dims (Gemma 2 / 3) take the kernels' wide variants; rope_attention stays with heads of up to
128 (a wide one-token step runs qkv_rope, then the split kernel).
"""

from vtllm.kernels.cuda import (
    _attention_flash,
    _attention_paged,
    _attention_prefill,
    _attention_ring,
    _attention_split,
)
from vtllm.kernels.cuda._attention_common import (
    _fits_scratch,
    check_attention,
    make_scratch,
    splits_for,
    supports,
)
from vtllm.kernels.cuda._attention_split import fuses_rope, rope_attention
from vtllm.kernels.cuda._qkv_rope import qkv_rope

__all__ = [
    "ROPE_TOKENS",
    "RING_MIN_ROWS",
    "fuses_rope",
    "make_scratch",
    "paged_attention",
    "qkv_attention",
    "qkv_rope",
    "rope_attention",
    "scratch_row_bytes",
    "supports",
]

ROPE_TOKENS = 1  # steps of up to this many tokens rotate inside attention (the docstring)
# Query rows from which the ring kernel runs rather than the split kernel: from here on it is
# level with or ahead of the split kernel with either cache type (bench/gpu_attention.py
# --cases, 8B shape; BENCHMARKS.md, Kernels); at one row the split kernel's many small blocks
# keep more SMs busy.
RING_MIN_ROWS = 4


def scratch_row_bytes(num_heads: int, head_dim: int, max_positions: int) -> int:
    """Bytes of make_scratch's pair per row: a split state (acc, max, sum) per head and split."""
    return 4 * num_heads * splits_for(max_positions) * (head_dim + 2)


def qkv_attention(
    qkv,
    q,
    k_cache,
    v_cache,
    slot_mapping,
    positions,
    cos_sin,
    eps,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    out,
    scratch,
    *,
    q_norm=None,
    k_norm=None,
    flash=False,
    window=0,
    softcap=0.0,
    stream=0,
) -> None:
    """out [T, Hq, D] <- attention of the step's queries, from the fused projection qkv
    [T, (Hq + 2 Hk) D]: q/k norm (with q_norm, k_norm), rotary, the new keys and values into
    the cache, then causal attention (the docstring says which kernels). q [T, Hq, D]: a
    buffer for the rotated queries of the unfused path. Arguments as qkv_rope's and
    paged_attention's."""
    T, Hq, D = out.shape
    if T <= ROPE_TOKENS and fuses_rope(Hq, k_cache.shape[2], D):
        rope_attention(
            qkv,
            k_cache,
            v_cache,
            slot_mapping,
            positions,
            cos_sin,
            eps,
            block_tables,
            seq_lens,
            query_start_loc,
            scale,
            out,
            scratch,
            q_norm=q_norm,
            k_norm=k_norm,
            window=window,
            softcap=softcap,
            stream=stream,
        )
        return
    qkv_rope(
        qkv,
        q,
        k_cache,
        v_cache,
        slot_mapping,
        positions,
        cos_sin,
        eps,
        q_norm=q_norm,
        k_norm=k_norm,
        stream=stream,
    )
    paged_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        scale,
        out,
        scratch=scratch,
        flash=flash,
        window=window,
        softcap=softcap,
        stream=stream,
    )


def paged_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    out,
    *,
    scratch=None,
    split=True,
    flash=False,
    window=0,
    softcap=0.0,
    stream=0,
) -> None:
    """Causal attention of q [T, Hq, D] over the paged cache (float32, or bf16 bits as uint16:
    kv_cache); out [T, Hq, D]. Device arrays.

    Sequence s owns rows query_start_loc[s]:query_start_loc[s+1] of q; its query i sits at
    position seq_lens[s] - n_s + i (seq_lens counts the new tokens, already in the cache) and
    attends to positions 0..itself through block_tables[s]. Query head h reads kv head
    h // (Hq // Hk). Rows of q outside every sequence are left unwritten in out.

    scratch (make_scratch's pair) lets decode-sized steps spread each row over many blocks;
    split=False runs the general kernel whatever the shape; flash (opt-in) sends the rows that
    would go to the prefill kernel to the flash kernel where it takes the cache and shape
    (tensor cores; other bits: _attention_flash). window > 0: query i sees only its last
    window positions (itself included); softcap > 0: scores s become softcap * tanh(s /
    softcap) before the softmax (the module docstring).
    """
    check_attention(
        "paged_attention", q, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc
    )
    if window < 0 or softcap < 0:
        raise ValueError(f"paged_attention: window {window} and softcap {softcap} must be >= 0")
    t, hq, d = q.shape
    if seq_lens.shape[0] == 0 or t == 0:
        return
    meta = (block_tables, seq_lens, query_start_loc)
    masks = {"window": window, "softcap": softcap}
    if not (split and supports(hq, k_cache.shape[2], d)):
        _attention_paged.general_attention(
            q, k_cache, v_cache, *meta, scale, out, **masks, stream=stream
        )
        return
    ring = t >= RING_MIN_ROWS
    if _fits_scratch(scratch, t, hq, d):  # decode: every row spread over blocks
        kernels = _attention_ring if ring else _attention_split
        kernels.decode_attention(
            q, k_cache, v_cache, *meta, scale, out, scratch, **masks, stream=stream
        )
        return
    head = scratch[0].shape[0] if ring and _fits_scratch(scratch, 1, hq, d) else 0
    if head:  # the leading rows (decodes) through the ring kernel, a block a row
        _attention_ring.decode_attention(
            q[:head], k_cache, v_cache, *meta, scale, out[:head], scratch, **masks, stream=stream
        )
    plain = not (window or softcap)
    if flash and plain and _attention_flash.supports(k_cache, hq, k_cache.shape[2], d):
        _attention_flash.flash_prefill(
            q, k_cache, v_cache, *meta, scale, out, first_token=head, stream=stream
        )
        return
    _attention_prefill.prefill_attention(
        q, k_cache, v_cache, *meta, scale, out, first_token=head, **masks, stream=stream
    )
