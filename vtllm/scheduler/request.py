"""One generation request as the scheduler tracks it: tokens, progress, slot and blocks."""

import random
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum

from vtllm.scheduler.sampling_params import SamplingParams

ROOT_HASH = 0x5EED_B10C  # parent hash of a prompt's first block


class RequestStatus(IntEnum):
    WAITING = 0  # queued, never seated
    RUNNING = 1  # holds a slot and blocks
    PREEMPTED = 2  # back in the queue, blocks and slot given up, known tokens kept
    FINISHED = 3


def _state(default):
    return field(default=default, init=False)


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    seed: int | None = None  # None: the user's seed, or a random one (fixed for the request)
    priority: int = 0  # lower is served first
    # What may be sampled next (engine/structured.TokenConstraint, or None): update() feeds it
    # each token the host learns; the engine asks it for the next step's mask.
    constraint: object = None
    # Everything below is the scheduler's state; add_request sets the first four.
    arrival: int = _state(0)
    order: tuple[int, int] = _state((0, 0))  # (priority, arrival): queue and preemption order
    max_output_tokens: int = _state(0)  # max_tokens, capped by max_model_len
    stop_ids: frozenset[int] = _state(frozenset())  # stop_token_ids, plus eos unless ignore_eos
    status: RequestStatus = _state(RequestStatus.WAITING)
    finish_reason: str | None = _state(None)
    stop_reason: int | str | None = _state(None)
    output_token_ids: list[int] = field(default_factory=list, init=False)  # seen by the host
    # Positions [0, num_computed_tokens) are computed or in flight; it moves at schedule time.
    num_computed_tokens: int = _state(0)
    # Sampled tokens in flight: they sit at the end of the sequence, on the device only.
    num_placeholders: int = _state(0)
    slot: int = _state(-1)
    block_ids: list[int] = field(default_factory=list, init=False)
    num_cached_tokens: int = _state(0)  # prefix-cache hit at first admission
    admitted: bool = _state(False)
    # Prefix-cache keys of full known blocks (computed once, extended as tokens arrive).
    block_keys: list[tuple[int, tuple[int, ...]]] = field(default_factory=list, init=False)
    num_registered_blocks: int = _state(0)  # leading blocks of block_ids offered to the cache
    prompt_logprobs_end: int = _state(0)  # prompt positions [0, end) had logprobs computed
    # Speculation (scheduler/speculative.py): whether this request proposes tokens, its tokens
    # as the proposer reads them, and the drafts of its step in flight ([] when none).
    speculates: bool = _state(False)
    history: object = _state(None)
    drafts_in_flight: list[int] = field(default_factory=list, init=False)
    # Sliding window (scheduler/sliding_window.py): leading block_ids entries freed as older
    # than every window still to come (now the null block), and (step id, start) of the
    # chunks planned since, oldest first, whose steps may still read older blocks.
    num_released_blocks: int = _state(0)
    chunks_in_flight: deque = field(default_factory=deque, init=False)

    def __post_init__(self):
        if self.seed is None:
            seed = self.sampling.seed
            # Drawn once so a request samples the same way however it is scheduled.
            self.seed = random.getrandbits(63) if seed is None else seed

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_known_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Every position that has a token, on the host or (placeholders) on the device."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_placeholders

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def all_token_ids(self) -> list[int]:
        """A fresh list of the known tokens (admission only: it is O(length))."""
        return self.prompt_token_ids + self.output_token_ids

    def cap_at_logprobs_mark(self, start: int, n: int) -> int:
        """Stop a recomputed chunk at the prompt-logprobs mark so no position is skipped."""
        mark = self.prompt_logprobs_end
        return mark - start if start < mark < start + n else n

    def take_prompt_logprobs(self, start: int, end: int) -> bool:
        """Whether chunk [start, end) returns prompt logprobs: prompt positions not yet done."""
        num_prompt = len(self.prompt_token_ids)
        if (
            self.sampling.prompt_logprobs is None
            or not self.prompt_logprobs_end <= start < num_prompt
        ):
            return False
        self.prompt_logprobs_end = min(end, num_prompt)
        return True

    def extend_block_keys(self, num_tokens: int, block_size: int) -> None:
        """Key every full block inside the first num_tokens known tokens, incrementally.

        A key is (parent hash, the block's token ids); the parent hash is hash() of the
        previous key, so a key names the whole prefix. The key itself is the cache's dict key,
        so equal hashes of different token tuples can never alias.
        """
        keys = self.block_keys
        num_blocks = min(num_tokens, self.num_known_tokens) // block_size
        if len(keys) >= num_blocks:
            return
        prompt, output = self.prompt_token_ids, self.output_token_ids
        num_prompt = len(prompt)
        parent = hash(keys[-1]) if keys else ROOT_HASH
        for i in range(len(keys), num_blocks):
            lo, hi = i * block_size, (i + 1) * block_size
            if hi <= num_prompt:
                tokens = tuple(prompt[lo:hi])
            elif lo >= num_prompt:
                tokens = tuple(output[lo - num_prompt : hi - num_prompt])
            else:
                tokens = tuple(prompt[lo:]) + tuple(output[: hi - num_prompt])
            key = (parent, tokens)
            keys.append(key)
            parent = hash(key)
