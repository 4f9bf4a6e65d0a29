"""Speculation, the scheduler's side: how many drafts a decoding request may carry, the n-gram
proposer (vLLM's prompt lookup), the roll back after verification, and the counters of what
verification accepted.

The proposer looks for the most recent earlier occurrence of the request's last n tokens
(n from prompt_lookup_max down to prompt_lookup_min) in its prompt and output, and proposes
the up-to-k tokens that followed it. It runs on the host every step a request speculates, so
each request keeps its tokens in a numpy array that grows by the new tokens only, and the
search is a few vectorized comparisons over that array.
"""

from dataclasses import dataclass, field

import numpy as np

from vtllm.scheduler.block_pool import BlockPool
from vtllm.scheduler.config import SchedulerConfig
from vtllm.scheduler.request import Request


class TokenHistory:
    """A request's known tokens (prompt, then outputs) as a growing int32 array."""

    __slots__ = ("tokens", "length")

    def __init__(self, capacity: int):
        self.tokens = np.empty(max(capacity, 16), np.int32)
        self.length = 0

    def sync(self, prompt: list[int], output: list[int]) -> np.ndarray:
        """Appends what arrived since the last call; returns the view of every known token."""
        num_prompt = len(prompt)
        total = num_prompt + len(output)
        if total > len(self.tokens):
            grown = np.empty(max(total, 2 * len(self.tokens)), np.int32)
            grown[: self.length] = self.tokens[: self.length]
            self.tokens = grown
        if self.length < num_prompt:
            self.tokens[self.length : num_prompt] = prompt[self.length :]
            self.length = num_prompt
        if self.length < total:
            self.tokens[self.length : total] = output[self.length - num_prompt :]
        self.length = total
        return self.tokens[:total]


def propose_ngram(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the last n tokens,
    for the longest n in [min_n, max_n] that occurs; [] when none does."""
    length = len(tokens)
    if k < 1 or length < min_n + 1:
        return []
    # A match ends at j < length - 1 with tokens[j] == the last token; it needs n - 1 more.
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])
    if not ends.size:
        return []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        candidates = ends[ends >= n - 1]
        ok = np.ones(candidates.size, bool)
        for back in range(1, n):
            ok &= tokens[candidates - back] == tokens[length - 1 - back]
        hits = candidates[ok]
        if hits.size:
            j = int(hits[-1])  # the most recent occurrence
            return tokens[j + 1 : j + 1 + k].tolist()
    return []


def may_speculate(config: SchedulerConfig, batch: int) -> bool:
    """Whether a step of `batch` running requests carries drafts: not once it reaches
    speculative_disable_by_batch_size. A large batch already fills the device with one token
    per request, so verifying k more rows each costs more than the accepted ones save; and it
    runs at depth 2, which a speculating request cannot (docs/speculative_decoding.md)."""
    limit = config.speculative_disable_by_batch_size
    return bool(config.num_speculative_tokens) and not 0 < limit <= batch


def num_drafts(req: Request, config: SchedulerConfig, room: int, batch: int) -> int:
    """How many drafts a decoding request may carry in a step of `batch` running requests: at
    most k, at most `room` (the step's budget past its own token), never more than max_tokens
    leaves room for after the target's own token, and none where may_speculate says no."""
    if not may_speculate(config, batch):
        return 0
    return min(
        config.num_speculative_tokens, room, req.max_output_tokens - len(req.output_token_ids) - 1
    )


def known_tokens(req: Request) -> np.ndarray:
    """The request's known tokens as an int32 array, kept on the request and grown by the
    new tokens only."""
    if req.history is None:
        req.history = TokenHistory(req.num_known_tokens + 64)
    return req.history.sync(req.prompt_token_ids, req.output_token_ids)


class NgramProposer:
    """Prompt lookup. A proposer has three methods: propose(req, k) -> up to k drafts after the
    request's known tokens; expects(req) -> whether a request whose last token is still in
    flight is likely to get drafts once it is known (else the scheduler plans it at depth 2
    without drafts rather than waiting for the token); and forget(req) when the request ends
    (engine/speculative_draft.py has the draft-model proposer)."""

    def __init__(self, config: SchedulerConfig):
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, req: Request, k: int) -> list[int]:
        return propose_ngram(known_tokens(req), k, self.min_n, self.max_n)

    def expects(self, req: Request) -> bool:
        """Whether the known tokens (the one in flight excluded) end in an n-gram that occurred
        before: inside text that repeats, the next lookup likely matches too; elsewhere waiting
        for the token would cost the step's overlap for a proposal that rarely comes."""
        return bool(propose_ngram(known_tokens(req), 1, self.min_n, self.max_n))

    def forget(self, req: Request) -> None:
        pass


def roll_back(req: Request, pool: BlockPool) -> None:
    """After a speculative step: KV is valid up to the position before the last token (which
    the next step computes); blocks past it held only rejected drafts and go back to the pool.
    The runner trims the slot's block table the same way (executor/speculative.py)."""
    req.num_computed_tokens = req.num_known_tokens - 1
    keep = -(-req.num_computed_tokens // pool.block_size)
    if len(req.block_ids) > keep:
        pool.free(req.block_ids[keep:])
        del req.block_ids[keep:]


@dataclass(slots=True)
class SpecStats:
    """What verification did, as vLLM counts it (read by /metrics)."""

    num_drafts: int = 0  # speculative chunks verified
    num_draft_tokens: int = 0  # proposed tokens verified
    num_accepted_tokens: int = 0  # proposals equal to the target's token
    accepted_per_pos: list[int] = field(default_factory=list)  # [k]: accepted at proposal i

    def record(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        per_pos = self.accepted_per_pos
        if len(per_pos) < num_drafts:
            per_pos.extend([0] * (num_drafts - len(per_pos)))
        for i in range(num_accepted):
            per_pos[i] += 1
