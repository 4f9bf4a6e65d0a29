"""Host-side bookkeeping both runners share: a plan's chunks flattened into the per-token and
per-sequence arrays the kernels read, and a seated request's sampling settings.

Backend-neutral on purpose: the CPU runner gathers its input ids from these arrays on the
host, the CUDA runner copies them to the device and gathers there.
"""

from dataclasses import dataclass

import numpy as np

from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan, TokenLogprobs


@dataclass(slots=True)
class FlatChunks:
    token_slots: np.ndarray  # [T] int32: slot of each token
    positions: np.ndarray  # [T] int32
    slot_mapping: np.ndarray  # [T] int32: KV cache row (block * block_size + offset)
    query_start_loc: np.ndarray  # [S + 1] int32
    seq_lens: np.ndarray  # [S] int32: context length after this step
    slots: np.ndarray  # [S] int32: slot of each chunk
    logits_rows: np.ndarray  # [R] int32: token rows whose logits are wanted
    # indices into logits_rows, one per sampling chunk: its (first) sampled row; a chunk with
    # d drafts has d + 1 rows from there on
    sample_rows: list[int]


def flatten_chunks(chunks: list[Chunk], block_tables: np.ndarray, block_size: int) -> FlatChunks:
    counts = np.fromiter((c.num_tokens for c in chunks), np.int32, len(chunks))
    starts = np.fromiter((c.start for c in chunks), np.int32, len(chunks))
    slots = np.fromiter((c.slot for c in chunks), np.int32, len(chunks))
    qsl = np.zeros(len(chunks) + 1, np.int32)
    np.cumsum(counts, out=qsl[1:])
    total = int(qsl[-1])
    # Per token: its sequence, and its position = chunk start + offset inside the chunk.
    seq_of = np.repeat(np.arange(len(chunks), dtype=np.int32), counts)
    positions = (np.arange(total, dtype=np.int32) - qsl[seq_of] + starts[seq_of]).astype(np.int32)
    token_slots = slots[seq_of]
    block_ids = block_tables[token_slots, positions // block_size]
    slot_mapping = (block_ids * block_size + positions % block_size).astype(np.int32)
    logits_rows, sample_rows = [], []
    for i, c in enumerate(chunks):
        if c.prompt_logprobs:
            logits_rows.extend(range(qsl[i], qsl[i + 1]))
        elif c.draft_token_ids:  # one row per draft to verify, and one past the last draft
            first = qsl[i + 1] - 1 - len(c.draft_token_ids)
            logits_rows.extend(range(first, qsl[i + 1]))
            sample_rows.append(len(logits_rows) - 1 - len(c.draft_token_ids))
            continue
        elif c.sample:
            logits_rows.append(qsl[i + 1] - 1)
        if c.sample:
            sample_rows.append(len(logits_rows) - 1)
    return FlatChunks(
        token_slots=token_slots,
        positions=positions,
        slot_mapping=slot_mapping,
        query_start_loc=qsl,
        seq_lens=(starts + counts).astype(np.int32),
        slots=slots,
        logits_rows=np.asarray(logits_rows, np.int32),
        sample_rows=sample_rows,
    )


def token_masks(masks: dict[int, bytes], chunks: list[Chunk]) -> list[tuple[int, np.ndarray]]:
    """(sampling row, int32 packed mask) for the sampling chunks whose slot has a mask."""
    return [
        (b, np.frombuffer(masks[c.slot], np.int32)) for b, c in enumerate(chunks) if c.slot in masks
    ]


def apply_token_masks(rows: np.ndarray, masks: list[tuple[int, np.ndarray]]) -> None:
    """rows [B, V] float32 in place: -inf where a row's mask bit is clear (bit t of word
    t // 32), and past the mask's width."""
    V = rows.shape[1]
    for b, bits in masks:
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:V]
        row = rows[b]
        row[len(allowed) :] = -np.inf
        row[: len(allowed)][allowed == 0] = -np.inf


GRAPH_MAX_TOKENS = 4096


def graph_buckets(max_num_seqs: int, max_tokens: int) -> list[int]:
    """Step sizes in tokens that get a CUDA graph; a step runs in the smallest bucket that
    holds its tokens, padded (pad_step). Up to max_num_seqs: 1, 2, 4, 8, then every 8, which
    a decode batch fills exactly or nearly. Above it (prefill and mixed steps) the spacing
    grows with the size, a quarter to an eighth of it (at least 32 tokens, the linear
    kernels' token tile): padding costs a step at most a quarter more compute, about a tenth
    on average, while a graph saves each of its few hundred kernels a Python launch.
    Steps over GRAPH_MAX_TOKENS run eagerly: their compute dwarfs the launches."""
    max_tokens = min(max_tokens, max(GRAPH_MAX_TOKENS, max_num_seqs))
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs] + list(range(8, max_num_seqs, 8))
    sizes.append(max_num_seqs)
    b = max_num_seqs
    while b < max_tokens:
        spacing = max(32, 1 << max(0, b.bit_length() - 3))
        b = min(max_tokens, (b // spacing + 1) * spacing)
        sizes.append(b)
    return sorted(set(sizes))


def graph_counts(bucket: int, max_num_seqs: int) -> tuple[int, int, int, int]:
    """(tokens, sequences, logits rows, sampled rows) of a bucket's graph: a step has no more
    sequences than tokens or slots, and one logits row per sampled sequence."""
    seqs = min(bucket, max_num_seqs)
    return bucket, seqs, seqs, seqs


def pad_step(fields: dict, tokens: int, seqs: int) -> dict:
    """A step's metadata (CudaModelRunner._fields, no prompt logprobs: one logits row per
    sampled chunk) padded to a graph's counts. Padding tokens have slot -1 (no KV write, id 0,
    in no sequence), padding sequences are empty (their range starts and ends at the last real
    token), padding logits rows are -1 (a zero row) and padding samples slot -1 (skipped)."""
    t, s = len(fields["token_slots"]), len(fields["seq_lens"])
    b = len(fields["sample_slots"])
    if len(fields["logits_rows"]) != b:
        raise ValueError("a graph step has one logits row per sampled chunk (no prompt logprobs)")
    if t > tokens or s > seqs:
        raise ValueError(f"a step of {t} tokens, {s} sequences does not fit ({tokens}, {seqs})")

    def tail(name, value, n):
        return np.concatenate([np.asarray(fields[name], np.int32), np.full(n, value, np.int32)])

    out = dict(fields)
    for name in ("token_slots", "slot_mapping"):
        out[name] = tail(name, -1, tokens - t)
    out["positions"] = tail("positions", 0, tokens - t)
    out["query_start_loc"] = tail("query_start_loc", t, seqs - s)
    out["seq_lens"] = tail("seq_lens", 0, seqs - s)
    tables = np.asarray(fields["block_tables"], np.int32)
    out["block_tables"] = np.concatenate([tables, np.zeros((seqs - s, tables.shape[1]), np.int32)])
    out["logits_rows"] = tail("logits_rows", -1, seqs - b)
    out["sample_rows"] = np.arange(seqs, dtype=np.int32)
    out["sample_slots"] = tail("sample_slots", -1, seqs - b)
    out["sample_positions"] = tail("sample_positions", 0, seqs - b)
    out["sample_masks"] = tail("sample_masks", -1, seqs - b)
    out["token_drafts"] = np.full(tokens, -1, np.int32)  # steps with drafts run eagerly
    return out


def seat_sampling(table, seat: SeatedRequest, eos_token_ids) -> None:
    """Writes a seated request's sampling settings into its slot of a SamplingTable."""
    sp = seat.sampling
    stops = list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(eos_token_ids))
    table.set_slot(
        seat.slot,
        temperature=sp.temperature,
        top_k=sp.top_k,
        top_p=sp.top_p,
        min_p=sp.min_p,
        seed=seat.seed,
        presence_penalty=sp.presence_penalty,
        frequency_penalty=sp.frequency_penalty,
        repetition_penalty=sp.repetition_penalty,
        min_tokens=sp.min_tokens,
        num_logprobs=-1 if sp.logprobs is None else sp.logprobs,
        prompt_len=seat.prompt_len,
        logit_bias=sp.logit_bias,
        min_stop_ids=stops,
    )


def extend_block_tables(chunks: list[Chunk], block_tables: np.ndarray, num_slot_blocks) -> None:
    """Appends each chunk's new blocks to its slot's block table (before the step runs)."""
    for chunk in chunks:
        if chunk.new_block_ids:
            start = num_slot_blocks[chunk.slot]
            end = start + len(chunk.new_block_ids)
            block_tables[chunk.slot, start:end] = chunk.new_block_ids
            num_slot_blocks[chunk.slot] = end


def prompt_logprobs(plan: StepPlan, logits, prompt_ids, prompt_lens, num_prompt_logprobs, ops):
    """Logprobs of the prompt tokens inside the chunks that asked for them, from host logits
    laid out as the step's logits rows (every row of such a chunk, the last row of other
    sampling chunks, the last d + 1 of one with d drafts). prompt_ids [slots, len] holds the
    prompts; ops is a CPU kernel table. Returns slot -> one TokenLogprobs per scored prompt
    token."""
    result, row = {}, 0
    for c in plan.chunks:
        if not c.prompt_logprobs:
            row += 1 + len(c.draft_token_ids) if c.sample else 0
            continue
        # Logits at position p score the prompt token at p + 1.
        last = min(c.start + c.num_tokens, int(prompt_lens[c.slot]) - 1)
        n, k = max(0, last - c.start), int(num_prompt_logprobs[c.slot])
        entries = []
        if n:
            next_ids = np.ascontiguousarray(prompt_ids[c.slot, c.start + 1 : last + 1])
            lp = ops.LogprobsOut.create(n)
            rows = np.ascontiguousarray(logits[row : row + n])
            ops.prompt_logprobs(rows, next_ids, k, lp.logprob, lp.rank, lp.top_ids, lp.top_logprobs)
            for j in range(n):
                top_ids, top_lps = lp.top_ids[j, :k].tolist(), lp.top_logprobs[j, :k].tolist()
                entries.append(
                    TokenLogprobs(
                        int(next_ids[j]), float(lp.logprob[j]), int(lp.rank[j]), top_ids, top_lps
                    )
                )
        result[c.slot] = entries
        row += c.num_tokens
    return result
