"""Speculative chunks in the executor: drafts into the mirror before the forward, their
verification after it (scheduler/plan.Chunk.draft_token_ids).

Verification is the sampler's own draw at each position: row j of a speculative chunk is
sampled exactly as a one-token step at that position would be (the same logits bits, since
kernels are batch invariant; the same mirror history, whose earlier positions hold the drafts
accepted so far; the same uniform, a hash of (seed, position)). A draft is accepted when that
draw equals it; the first draw that differs, or the draw after the last draft, is the target's
own token. For a greedy row that is "accept while the draft is the argmax". For a sampled row
it is rejection sampling with a one-hot proposal x: the draw equals x with probability p(x),
and otherwise it is distributed as p with x removed, renormalised, which is the rule that
preserves the target distribution. Deciding and resampling with one uniform makes a seeded
request's tokens the ones it gets without speculation, bit for bit.
"""

import numpy as np

from vtllm.scheduler.plan import Chunk, TokenLogprobs


def write_drafts(token_ids: np.ndarray, chunks: list[Chunk]) -> None:
    """Each chunk's drafts into the mirror at its last positions, where the forward reads them."""
    for c in chunks:
        drafts = c.draft_token_ids
        if drafts:
            end = c.start + c.num_tokens
            token_ids[c.slot, end - len(drafts) : end] = drafts


def token_drafts(flat, chunks) -> np.ndarray:
    """[T] int32: the draft each token row carries, -1 for the others (a chunk's d drafts sit
    on the d token rows after its first logits row)."""
    out = np.full(len(flat.positions), -1, np.int32)
    for b, c in enumerate(chunks):
        if c.draft_token_ids:
            first = int(flat.logits_rows[flat.sample_rows[b]]) + 1
            out[first : first + len(c.draft_token_ids)] = c.draft_token_ids
    return out


def first_sample_positions(chunks: list[Chunk]) -> np.ndarray:
    """[B] int32: the position each sampling chunk's first sampled token takes."""
    return np.fromiter(
        (c.start + c.num_tokens - len(c.draft_token_ids) for c in chunks), np.int32, len(chunks)
    )


def token_logprobs(token: int, lp, i: int, k: int) -> TokenLogprobs:
    """Row i of a LogprobsOut as the TokenLogprobs of `token`, with k top alternatives."""
    return TokenLogprobs(
        token, float(lp.logprob[i]), int(lp.rank[i]), lp.top_ids[i, :k].tolist(),
        lp.top_logprobs[i, :k].tolist(),
    )  # fmt: skip


def verify_drafts(ops, logits, sample_rows, chunks, tokens, positions, num_logprobs, runner):
    """After the first draw of every sampling chunk (tokens [B]), the draws past it of the
    speculative chunks: round j samples row j of each chunk whose draws so far all equalled
    its drafts. Returns, per sampling chunk, None or (more_ids, more_logprobs): its tokens
    after the first, and their logprobs when the request asked. Rolls the block tables of
    the speculative chunks back as the scheduler does (roll_back_blocks)."""
    more = [None] * len(chunks)
    alive = []
    for b, c in enumerate(chunks):
        if c.draft_token_ids:
            more[b] = ([], [])
            alive.append(b)
    last = tokens.tolist()
    j = 1
    while True:
        alive = [
            b
            for b in alive
            if j <= len(chunks[b].draft_token_ids) and last[b] == chunks[b].draft_token_ids[j - 1]
        ]
        if not alive:
            roll_back_blocks(runner, chunks, positions, more)
            return more
        n = len(alive)
        rows = np.ascontiguousarray(logits[[sample_rows[b] + j for b in alive]])
        slots = np.fromiter((chunks[b].slot for b in alive), np.int32, n)
        round_positions = positions[alive] + np.int32(j)
        want = max(num_logprobs[b] for b in alive) >= 0
        lp = ops.LogprobsOut.create(n) if want else None
        out = np.empty(n, np.int32)
        ops.sample(
            rows,
            slots,
            round_positions,
            runner.sampling,
            runner.token_ids,
            runner.num_tokens,
            out,
            out_logprobs=lp,
        )
        for i, b in enumerate(alive):
            token = int(out[i])
            last[b] = token
            more[b][0].append(token)
            if num_logprobs[b] >= 0:
                more[b][1].append(token_logprobs(token, lp, i, num_logprobs[b]))
        j += 1


def roll_back_blocks(runner, chunks, positions, more) -> None:
    """A speculative chunk's KV is valid up to the position before its last token; blocks
    past that held only rejected drafts and go back to the pool in the scheduler's update, so
    the slot's table forgets them here (the next plan appends its new blocks after it).
    more[b] None: chunk b is left alone."""
    bs = runner.block_size
    for b, c in enumerate(chunks):
        if more[b] is not None:
            num_computed = int(positions[b]) + len(more[b][0])
            runner.num_slot_blocks[c.slot] = -(-num_computed // bs)
