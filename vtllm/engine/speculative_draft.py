"""Draft-model speculation: a second, smaller model of the target's vocabulary proposes k
tokens greedily (the proposer interface of scheduler/speculative.py).

It runs on the CPU kernels like the target, on the thread that schedules, with a KV cache of
its own: DRAFT_SLOTS slots of max_model_len tokens each, held by the requests that proposed
most recently (the least recently used one gives its slot up, and recomputes its KV if it
proposes again). A proposal recomputes the positions whose tokens changed since the request's
last one (its rejected drafts, and what the target emitted), samples the first draft from the
last known token's logits, then runs k - 1 one-token greedy steps. Every proposal reseats the
slot with the request's known tokens, so its mirror never holds a stale token. Outputs never
depend on the drafts (the target verifies each one); only how many are accepted does.
"""

from collections import OrderedDict
from dataclasses import dataclass
from itertools import count

import numpy as np

from vtllm.errors import InvalidParameter
from vtllm.executor.kv_cache import allocate_kv_cache
from vtllm.executor.runner import ModelRunner
from vtllm.models.loader import LoadedModel, load_model
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.request import Request
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.scheduler.speculative import known_tokens

DRAFT_SLOTS = 16  # requests whose draft KV stays cached (KV: slots x max_model_len tokens)
_GREEDY = SamplingParams(temperature=0.0, max_tokens=None)


@dataclass(slots=True)
class _DraftState:
    slot: int
    blocks: list[int]  # the slot's fixed region of the draft's KV cache
    tokens: np.ndarray  # [num_computed] int32: the tokens whose KV the slot holds


class DraftModelProposer:
    def __init__(self, runner: ModelRunner, num_slots: int):
        self.runner = runner
        per_slot = -(-(runner.max_model_len + 1) // runner.block_size)
        self._regions = [list(range(1 + s * per_slot, 1 + (s + 1) * per_slot)) for s in
                         range(num_slots)]  # fmt: skip
        self._states: OrderedDict[str, _DraftState] = OrderedDict()  # LRU first
        self._free = list(range(num_slots))
        self._step_ids = count()
        self.num_forwards = 0

    def propose(self, req: Request, k: int) -> list[int]:
        known = known_tokens(req)
        state = self._state(req.request_id)
        last = len(known) - 1  # the last known token's position: its KV is not computed yet
        # The slot holds KV of the tokens known at its last proposal and of its drafts but the
        # last; from the first of those that is not the request's token, it is redone (a
        # rejected draft; or any, when steps ran without proposals since: none were verified)
        n = min(len(state.tokens), last)
        mismatch = np.flatnonzero(state.tokens[:n] != known[:n])
        valid = int(mismatch[0]) if mismatch.size else n
        slot = state.slot
        seat = SeatedRequest(slot, known.tolist(), req.num_prompt_tokens, _GREEDY, 0, state.blocks)
        chunk = Chunk(slot, valid, last + 1 - valid, [], True)
        drafts = [self._run(StepPlan(next(self._step_ids), [seat], [chunk], [slot]))]
        for j in range(1, k):
            chunk = Chunk(slot, last + j, 1, [], True)
            drafts.append(self._run(StepPlan(next(self._step_ids), [], [chunk], [])))
        state.tokens = np.concatenate([known, np.asarray(drafts[:-1], np.int32)])
        return drafts

    def expects(self, req: Request) -> bool:
        """A draft model proposes at every step: a speculating request waits for its token."""
        return True

    def forget(self, req: Request) -> None:
        state = self._states.pop(req.request_id, None)
        if state is not None:
            self._free.append(state.slot)

    def _state(self, request_id: str) -> _DraftState:
        state = self._states.get(request_id)
        if state is not None:
            self._states.move_to_end(request_id)
            return state
        if self._free:
            slot = self._free.pop()
        else:  # the least recently used request gives its slot up
            slot = self._states.popitem(last=False)[1].slot
        state = _DraftState(slot, self._regions[slot], np.empty(0, np.int32))
        self._states[request_id] = state
        return state

    def _run(self, plan: StepPlan) -> int:
        self.num_forwards += 1
        return self.runner.execute(plan).sampled[0].token_id


def draft_proposer(
    path: str, target: LoadedModel, ops, *, block_size: int, max_num_seqs: int, max_model_len: int
) -> DraftModelProposer:
    """Loads the draft checkpoint and gives it its KV cache; a draft whose vocabulary differs
    from the target's, or whose context is shorter, fails naming speculative_config."""
    draft = load_model(path)
    param = "speculative_config"
    if draft.config.vocab_size != target.config.vocab_size:
        raise InvalidParameter(
            f"{param}: the draft model's vocabulary ({draft.config.vocab_size} tokens) is not "
            f"the target's ({target.config.vocab_size})",
            param=param,
        )
    if draft.config.max_position_embeddings < max_model_len:
        raise InvalidParameter(
            f"{param}: the draft model's context ({draft.config.max_position_embeddings}) is "
            f"shorter than max_model_len ({max_model_len})",
            param=param,
        )
    slots = min(max_num_seqs, DRAFT_SLOTS)
    per_slot = -(-(max_model_len + 1) // block_size)
    kv = allocate_kv_cache(draft.config, 1 + slots * per_slot, block_size)
    runner = ModelRunner(draft, ops, kv, max_num_seqs=slots, max_model_len=max_model_len)
    return DraftModelProposer(runner, slots)
