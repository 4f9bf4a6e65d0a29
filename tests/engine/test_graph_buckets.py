"""The CUDA runner's graph buckets and the padding that fits a step into one (host-side logic;
the graphs themselves run in tests/gpu: the depth-2 law with graphs on replays prefill, mixed
and decode steps through them)."""

import numpy as np
import pytest

from vtllm.executor.step_layout import (
    GRAPH_MAX_TOKENS,
    flatten_chunks,
    graph_buckets,
    graph_counts,
    pad_step,
)
from vtllm.scheduler.plan import Chunk


def test_buckets_cover_every_step_size_with_bounded_padding():
    for seqs, tokens in [(64, 2048), (16, 64), (8, 1 << 20), (1, 16), (256, 300), (5, 4097)]:
        buckets = graph_buckets(seqs, tokens)
        assert buckets == sorted(set(buckets))
        top = min(tokens, max(GRAPH_MAX_TOKENS, seqs))
        assert buckets[-1] == top
        assert {b for b in (1, 2, 4, 8) if b <= seqs} <= set(buckets)
        for n in range(1, top + 1):
            b = next(b for b in buckets if b >= n)
            if n > seqs:  # past the decode sizes: at most a quarter more, or one 32-token tile
                assert b <= max(n + 31, n * 1.25), (seqs, tokens, n, b)
            else:
                assert b <= max(n + 7, 2 * n), (seqs, tokens, n, b)


def _step(block_tables):
    chunks = [
        Chunk(slot=2, start=0, num_tokens=5, new_block_ids=[], sample=True),  # a prompt
        Chunk(slot=0, start=9, num_tokens=1, new_block_ids=[], sample=True),  # a decode row
        Chunk(slot=1, start=4, num_tokens=3, new_block_ids=[], sample=False),  # a prompt part
    ]
    flat = flatten_chunks(chunks, block_tables, 4)
    sampled = [c for c in chunks if c.sample]
    return flat, {
        "token_slots": flat.token_slots,
        "positions": flat.positions,
        "slot_mapping": flat.slot_mapping,
        "query_start_loc": flat.query_start_loc,
        "seq_lens": flat.seq_lens,
        "block_tables": block_tables[flat.slots],
        "logits_rows": flat.logits_rows,
        "sample_rows": flat.sample_rows,
        "sample_slots": [c.slot for c in sampled],
        "sample_positions": [c.start + c.num_tokens for c in sampled],
        "sample_masks": [1, -1][: len(sampled)],
    }


def test_padding_keeps_the_real_step_and_pads_with_inert_rows():
    tables = np.arange(3 * 5, dtype=np.int32).reshape(3, 5)
    flat, fields = _step(tables)
    tokens, seqs, rows, sampled = graph_counts(16, 4)
    assert (tokens, seqs, rows, sampled) == (16, 4, 4, 4)
    padded = pad_step(fields, tokens, seqs)
    t, s = len(flat.positions), len(flat.seq_lens)
    assert (t, s) == (9, 3)
    for name in ("token_slots", "positions", "slot_mapping"):
        assert padded[name].shape == (tokens,)
        assert (padded[name][:t] == fields[name]).all()
    assert (padded["token_slots"][t:] == -1).all() and (padded["slot_mapping"][t:] == -1).all()
    # padding sequences are empty ranges at the end: no real token falls into them
    assert padded["query_start_loc"].tolist() == flat.query_start_loc.tolist() + [t]
    assert padded["seq_lens"].tolist() == flat.seq_lens.tolist() + [0]
    assert padded["block_tables"].shape == (seqs, 5)
    assert (padded["block_tables"][:s] == fields["block_tables"]).all()
    # one logits row per sampled chunk, in order, then -1 (a zero row)
    assert padded["logits_rows"].tolist() == flat.logits_rows.tolist() + [-1, -1]
    assert padded["sample_rows"].tolist() == [0, 1, 2, 3]
    assert padded["sample_slots"].tolist() == [2, 0, -1, -1]
    assert padded["sample_positions"].tolist() == [5, 10, 0, 0]
    assert padded["sample_masks"].tolist() == [1, -1, -1, -1]
    assert fields["token_slots"].shape == (t,)  # the caller's arrays are left alone


def test_padding_refuses_steps_that_do_not_fit():
    _, fields = _step(np.zeros((3, 5), np.int32))
    with pytest.raises(ValueError, match="9 tokens"):
        pad_step(fields, 8, 4)
    with pytest.raises(ValueError, match="3 sequences"):
        pad_step(fields, 16, 2)
    with_prompt_logprobs = dict(fields, logits_rows=np.arange(6, dtype=np.int32))
    with pytest.raises(ValueError, match="one logits row per sampled chunk"):
        pad_step(with_prompt_logprobs, 16, 4)
