"""The contract between the scheduler and the executor: one StepPlan in, one StepResult out.

The executor keeps per-slot state (the token mirror, block tables, sampling settings), so a
plan only carries what changed: requests taking a slot, the chunks to compute, slots let go.
Input ids are never sent per step: a chunk's ids are gathered from the mirror,
`token_ids[slot, start : start + num_tokens]`, which holds prompts and sampled tokens alike.
"""

import msgspec

from vtllm.scheduler.sampling_params import SamplingParams


class SeatedRequest(msgspec.Struct, array_like=True):
    """A request taking a slot: first admission, or re-admission after preemption."""

    slot: int
    token_ids: list[int]  # every known token: the prompt, then outputs known so far
    prompt_len: int
    sampling: SamplingParams
    seed: int  # the request's RNG seed (drawn at random when the user gave none)
    block_ids: list[int]  # the slot's block table so far (prefix-cache hits included)


class Chunk(msgspec.Struct, array_like=True):
    """Compute tokens [start, start + num_tokens) of a slot; sample the next one if `sample`.

    With draft_token_ids (speculation, d of them): the chunk's last d positions hold the
    drafts, which the executor writes into the mirror before the step runs; it samples the
    last d + 1 rows in order and keeps going while its token equals the next draft."""

    slot: int
    start: int
    num_tokens: int
    new_block_ids: list[int]  # appended to the slot's block table before this step runs
    sample: bool
    prompt_logprobs: bool = False  # return logprobs of prompt tokens inside this chunk
    draft_token_ids: list[int] = []  # proposed tokens at the chunk's last positions


class StepPlan(msgspec.Struct, array_like=True):
    step_id: int
    seated: list[SeatedRequest]
    chunks: list[Chunk]
    freed_slots: list[int]  # applied before `seated`, so a slot can be freed and reused at once
    # slot -> packed mask of the tokens its sampled row may take (bit t of int32 word t // 32),
    # for constrained requests; the engine fills it once their previous tokens are known
    token_masks: dict[int, bytes] = {}
    # slot -> n: the slot's block-table entries [0, n) were freed as outside every sliding
    # window still to come and are the null block now; applied before `freed_slots`, so it
    # never touches the table of a request seated in this plan
    released_blocks: dict[int, int] = {}


class TokenLogprobs(msgspec.Struct, array_like=True):
    """Logprob of one chosen token plus the top alternatives, from the raw model distribution."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top_ids: list[int]
    top_logprobs: list[float]


class SampledToken(msgspec.Struct, array_like=True):
    slot: int
    token_id: int
    logprobs: TokenLogprobs | None = None
    # a speculative chunk's tokens after token_id, in order (token_id is the first accepted
    # draft, or the target's own token); their logprobs too when the request asked
    more_ids: list[int] = []
    more_logprobs: list[TokenLogprobs] = []


class StepResult(msgspec.Struct, array_like=True):
    step_id: int
    sampled: list[SampledToken]  # one per chunk with sample=True, in chunk order
    prompt_logprobs: dict[int, list[TokenLogprobs]] = {}  # slot -> one entry per prompt token
