"""Continuous batching: chunked prefill, prefix caching, preemption by recompute, and the
placeholders that let the depth-2 executor plan step N+1 before the host has seen step N.

Hot path: schedule() and update() run every step and must stay O(requests touched), never
O(tokens). Keep them lean; put features in helpers. Over 400 lines because schedule(), _admit
and _preempt_for share the block pool's invariants step by step; block_pool.py holds the rest.

How placeholders work: a chunk that samples adds one placeholder to its request (a token that
exists only in the device mirror). num_computed_tokens moves at schedule time, so a decode
whose token is in flight is scheduled again at the placeholder's position and the executor
gathers that token on the device. update() turns the oldest placeholder into a known token.
Each in-flight step remembers its sampling requests in chunk order, so a late result reaches
the right request even when its slot was reused; results of finished requests are dropped.

Speculation (n-gram prompt lookup, scheduler/speculative.py): a decoding request's chunk
carries up to k proposed tokens after its last token, and the executor returns between 1 and
k + 1 tokens for it. How many is unknown until the result is read, so the next position of a
speculating request is unknown too: such a request is not planned again while its step is in
flight (it runs at depth 1; the rest of the batch keeps depth 2), unless the batch is too large
to speculate (speculative_disable_by_batch_size), or its in-flight step carries no drafts and
the proposer expects none once the token in flight is known (n-gram: the known tokens' own
suffix has no earlier occurrence): then it runs at depth 2 without drafts, and waits for its
last token again once a proposal looks likely. Planning its next step from a guess would waste
a step whenever a proposal is rejected, and the proposal itself needs the last token, which
only the result brings. The law still holds: a speculating request's
tokens are what one-token steps would sample (the executor accepts a draft only when its own
draw at that position gives it), and it is planned from host-known tokens only, at any depth.
update() rolls back the rejected positions: the request's computed count moves back to its
last token, and blocks that held only rejected positions return to the pool. What proposes is
pluggable (n-gram lookup by default; the engine passes a draft model's proposer).

Sliding window (config.sliding_window, when every layer has one): each schedule() first frees
the running requests' blocks that lie wholly before the window of every query still to run,
the chunks in flight included (scheduler/sliding_window.py); the table keeps their positions
as null entries, the plan tells the executor (released_blocks), and a request then holds a
window's blocks plus its chunks', so the free-block count, admission and preemption all see
the smaller use with no other change.
"""

from bisect import insort
from collections import deque
from heapq import heapify, heappop, heappush
from itertools import count
from operator import attrgetter

from vtllm.errors import ContextLengthExceeded, InvalidParameter, RequestRejected
from vtllm.scheduler.block_pool import BlockPool
from vtllm.scheduler.config import SchedulerConfig
from vtllm.scheduler.output import ABORT, LENGTH, STOP, Delta
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan, StepResult
from vtllm.scheduler.request import Request, RequestStatus
from vtllm.scheduler.sliding_window import (
    find_window_hit,
    first_query_to_come,
    forget_window_state,
    live_blocks,
    peak_blocks,
    release_outside_window,
)
from vtllm.scheduler.speculative import (
    NgramProposer,
    SpecStats,
    may_speculate,
    num_drafts,
    roll_back,
)

RUNNING, FINISHED = RequestStatus.RUNNING, RequestStatus.FINISHED
_order = attrgetter("order")


class Scheduler:
    def __init__(self, config: SchedulerConfig, proposer=None):
        """proposer: what proposes drafts when config.num_speculative_tokens > 0
        (scheduler/speculative.NgramProposer unless given)."""
        self.config = config
        self.pool = BlockPool(
            config.num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            resident_cap=config.resident_blocks or None,
        )
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: list[Request] = []  # WAITING and PREEMPTED, sorted by (priority, arrival)
        self.running: list[Request] = []  # RUNNING, same order: the tail is preempted first
        self._free_slots = list(range(config.max_num_seqs))  # min-heap: slots stay compact
        heapify(self._free_slots)
        self._freed_slots: list[int] = []  # for the next plan
        # every layer's sliding window (0: none), and slot -> leading block-table entries freed
        # outside it since the last plan (scheduler/sliding_window.py)
        self._window = config.sliding_window
        self._released: dict[int, int] = {}
        # (step_id, requests of the sampling chunks in chunk order, slot -> request of the
        # chunks that asked for prompt logprobs) per launched step, oldest first.
        self._in_flight: deque[tuple[int, list[Request], dict[int, Request]]] = deque()
        self._next_step_id = 0
        # requests of the last plan's sampling chunks that carry a constraint: the engine
        # fills their token masks before it launches the plan
        self.constrained: list[Request] = []
        self._arrivals = count()
        self.num_preemptions = 0
        self.spec_stats = SpecStats() if config.num_speculative_tokens else None
        if config.num_speculative_tokens and proposer is None:
            proposer = NgramProposer(config)
        self.proposer = proposer

    # -- intake ------------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a request, or raise a user error if it can never be served (nothing kept)."""
        cfg = self.config
        if request.request_id in self.requests or request.status != RequestStatus.WAITING:
            raise RequestRejected(f"request {request.request_id!r} was already added")
        num_prompt = len(request.prompt_token_ids)
        if num_prompt == 0:
            raise InvalidParameter("the prompt must hold at least one token", param="prompt")
        room = cfg.max_model_len - num_prompt
        max_tokens = request.sampling.max_tokens
        if room < 1 or (max_tokens is not None and max_tokens > room):
            wanted = max_tokens or 1
            raise ContextLengthExceeded(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, "
                f"you requested {num_prompt + wanted} tokens ({num_prompt} in the prompt, "
                f"{wanted} in the completion). Please reduce the prompt or max_tokens.",
                param="prompt" if room < 1 else "max_tokens",
            )
        max_output = room if max_tokens is None else max_tokens
        # The last sampled token is never computed, so its KV needs no block; a sliding
        # window bounds what the request holds at once (sliding_window.peak_blocks).
        max_blocks = peak_blocks(
            num_prompt + max_output - 1, cfg.block_size, self._window, cfg.max_num_batched_tokens
        )
        if max_blocks > self.pool.num_usable_blocks:
            raise RequestRejected(
                f"the request needs up to {max_blocks} KV-cache blocks "
                f"({num_prompt} prompt + {max_output} output tokens) but the cache holds "
                f"{self.pool.num_usable_blocks}; lower max_tokens or shorten the prompt",
                param="max_tokens",
            )
        request.arrival = next(self._arrivals)
        request.order = (request.priority, request.arrival)
        request.max_output_tokens = max_output
        sampling = request.sampling
        stop_ids = set(sampling.stop_token_ids)
        if not sampling.ignore_eos:
            stop_ids.update(cfg.eos_token_ids)
        request.stop_ids = frozenset(stop_ids)
        # token masks follow every earlier token, which a draft's row does not know yet
        request.speculates = bool(cfg.num_speculative_tokens) and request.constraint is None
        self.requests[request.request_id] = request
        insort(self.waiting, request, key=_order)

    def abort_request(self, request_id: str) -> Delta | None:
        """Finish with reason "abort" and return its final Delta now; unknown/finished: None."""
        return self.finish_request(request_id, ABORT)

    def finish_request(
        self,
        request_id: str,
        reason: str,
        stop_reason: int | str | None = None,
        num_output_tokens: int | None = None,
    ) -> Delta | None:
        """End a request decided outside (stop string, abort, error); returns its final Delta.

        The Delta is returned rather than queued for update() so it arrives even when no step
        runs again. A result of this request still in flight is dropped when it lands.
        num_output_tokens drops the outputs past it (a stop string inside a speculated run:
        without speculation the tokens after it were never sampled).
        """
        request = self.requests.get(request_id)
        if request is None:
            return None
        if num_output_tokens is not None:
            del request.output_token_ids[num_output_tokens:]
        self._finish(request, reason, stop_reason)
        return _delta(request, [])

    # -- stepping ----------------------------------------------------------------------------

    def schedule(self) -> StepPlan | None:
        """Plan the next step, or None when nothing can run now (then launch nothing)."""
        cfg, pool, running = self.config, self.pool, self.running
        bs, caching = cfg.block_size, cfg.enable_prefix_caching
        budget = cfg.max_num_batched_tokens
        chunks: list[Chunk] = []
        samplers: list[Request] = []
        plp_slots: dict[int, Request] = {}  # chunks that return prompt logprobs
        preempted = False
        step_id = self._next_step_id
        if self._window:
            self._release_outside_window()
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            start = req.num_computed_tokens
            if caching and req.num_registered_blocks < start // bs:
                pool.cache_full_blocks(req, start)  # positions launched in earlier steps
            num_out, ph = len(req.output_token_ids), req.num_placeholders
            if ph and (
                num_out + ph >= req.max_output_tokens
                or (
                    req.speculates
                    and (
                        req.drafts_in_flight
                        or (may_speculate(cfg, len(running)) and self.proposer.expects(req))
                    )
                )
            ):
                # speculating: its next position is known once its step is read, and a
                # proposal needs its last token (docstring); else its last token is in flight:
                # it finishes at the next update
                i += 1
                continue
            num_tokens = len(req.prompt_token_ids) + num_out + ph
            n = num_tokens - start
            drafts = ()
            if n == 1 and req.speculates and not ph and start >= len(req.prompt_token_ids):
                k = num_drafts(req, cfg, budget - (len(running) - i), len(running))
                drafts = self.proposer.propose(req, k) if k > 0 else ()
                n += len(drafts)
            if n > 1 and not drafts:  # drafts already left room for the requests behind
                # A prefill continuation leaves one token for each request behind it, so a
                # long prompt never stalls the decodes.
                n = min(n, budget - (len(running) - i - 1))
                if n <= 0:
                    i += 1
                    continue
                if req.sampling.prompt_logprobs is not None:
                    n = req.cap_at_logprobs_mark(start, n)
            end = start + n
            need = (end + bs - 1) // bs - len(req.block_ids)
            if drafts and need > pool.num_free_blocks:  # speculation never preempts
                n, end, drafts = 1, start + 1, ()
                need = (end + bs - 1) // bs - len(req.block_ids)
            if need > pool.num_free_blocks:
                preempted = True
                if not self._preempt_for(need, i):
                    break  # req itself went back to the queue; it was the last one
            if need > 0:
                new_blocks = pool.allocate(need)
                req.block_ids.extend(new_blocks)
            else:
                new_blocks = []
            want_plp = req.sampling.prompt_logprobs is not None and req.take_prompt_logprobs(
                start, end
            )
            sample = end == num_tokens + len(drafts)
            if drafts:
                req.drafts_in_flight = drafts
                chunks.append(Chunk(req.slot, start, n, new_blocks, True, False, drafts))
            else:
                chunks.append(Chunk(req.slot, start, n, new_blocks, sample, want_plp))
            req.num_computed_tokens = end
            if self._window:
                req.chunks_in_flight.append((step_id, start))
            budget -= n
            if sample:
                req.num_placeholders = ph + 1
                samplers.append(req)
            if want_plp:
                plp_slots[req.slot] = req
            i += 1
        seated: list[SeatedRequest] = []
        if not preempted:  # blocks are short: let running requests finish first
            waiting, j = self.waiting, 0
            while j < len(waiting) and budget > 0 and self._free_slots:
                req = waiting[j]
                if req.num_placeholders:
                    j += 1  # preempted with a token in flight: seat it once that lands
                    continue
                admitted = self._admit(req, budget, step_id)
                if admitted is None:
                    break  # the head does not fit: keep FCFS order, no overtaking
                del waiting[j]
                seat, chunk = admitted
                seated.append(seat)
                chunks.append(chunk)
                budget -= chunk.num_tokens
                if chunk.sample:
                    samplers.append(req)
                if chunk.prompt_logprobs:
                    plp_slots[req.slot] = req
        if not chunks:
            return None  # freed slots wait for the next plan: no seat needs them before it
        if any(c.num_tokens > 1 for c in chunks[:-1]):
            # one-token chunks (decodes) first: the CUDA backend's attention gives a long
            # step's leading rows to its decode kernel, a prompt continuation ahead of them
            # would push them into the prefill kernel, which is slow on one-token sequences
            chunks.sort(key=lambda c: c.num_tokens > 1)
            by_slot = {req.slot: req for req in samplers}
            samplers = [by_slot[c.slot] for c in chunks if c.sample]
        self._next_step_id += 1
        plan = StepPlan(step_id, seated, chunks, self._freed_slots)
        self._freed_slots = []
        if self._released:
            plan.released_blocks, self._released = self._released, {}
        self.constrained = [r for r in samplers if r.constraint is not None]
        self._in_flight.append((step_id, samplers, plp_slots))
        return plan

    def update(self, result: StepResult) -> list[Delta]:
        """Take the oldest in-flight step's tokens: append, check stops, emit Deltas."""
        if not self._in_flight:
            raise RuntimeError(f"update(step {result.step_id}) with no step in flight")
        step_id, samplers, plp_slots = self._in_flight.popleft()
        if result.step_id != step_id or len(result.sampled) != len(samplers):
            raise RuntimeError(
                f"result of step {result.step_id} with {len(result.sampled)} tokens, expected "
                f"step {step_id} with {len(samplers)}"
            )
        plp = _route_prompt_logprobs(result, plp_slots) if result.prompt_logprobs else None
        deltas = []
        for req, sampled in zip(samplers, result.sampled, strict=True):
            req.num_placeholders -= 1
            if req.status == FINISHED:
                continue  # stopped or aborted meanwhile: the extra token is discarded
            if req.drafts_in_flight:
                deltas.append(self._take_speculated(req, sampled))
                continue
            token = sampled.token_id
            out = req.output_token_ids
            out.append(token)
            if req.constraint is not None:
                req.constraint.accept(token)
            sampling = req.sampling
            reason = stop_reason = None
            if token in req.stop_ids and len(out) >= sampling.min_tokens:
                reason = STOP
                stop_reason = token if token in sampling.stop_token_ids else None
            elif len(out) >= req.max_output_tokens:
                reason = LENGTH
            if reason is not None:
                self._finish(req, reason, stop_reason)
            logprobs = None if sampling.logprobs is None else [sampled.logprobs]
            deltas.append(
                _delta(req, [token], logprobs, plp.pop(req.request_id, None) if plp else None)
            )
        if plp:  # prompt chunks that did not sample
            deltas.extend(_delta(self.requests[rid], [], None, lps) for rid, lps in plp.items())
        return deltas

    def has_work(self) -> bool:
        """Requests to serve, or steps whose results update() still has to take."""
        return bool(self.requests) or bool(self._in_flight)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used_blocks

    def _take_speculated(self, req: Request, sampled) -> Delta:
        """A speculative chunk's tokens: kept up to the first stop (as one-token steps would
        have stopped), then the rejected positions rolled back."""
        drafts, req.drafts_in_flight = req.drafts_in_flight, []
        tokens = [sampled.token_id, *sampled.more_ids]
        self.spec_stats.record(len(drafts), len(tokens) - 1)
        out, sampling = req.output_token_ids, req.sampling
        reason = stop_reason = None
        for n, token in enumerate(tokens, 1):
            out.append(token)
            if token in req.stop_ids and len(out) >= sampling.min_tokens:
                reason = STOP
                stop_reason = token if token in sampling.stop_token_ids else None
            elif len(out) >= req.max_output_tokens:
                reason = LENGTH
            if reason is not None:
                del tokens[n:]
                break
        if req.status == RUNNING:  # before _finish, which caches full blocks
            roll_back(req, self.pool)
        if reason is not None:
            self._finish(req, reason, stop_reason)
        logprobs = None
        if sampling.logprobs is not None:
            logprobs = [sampled.logprobs, *sampled.more_logprobs][: len(tokens)]
        return _delta(req, tokens, logprobs)

    def _admit(self, req: Request, budget: int, step_id: int) -> tuple[SeatedRequest, Chunk] | None:
        """Seat a queued request with its first chunk, or None (nothing changed) if no room."""
        cfg, pool = self.config, self.pool
        bs = cfg.block_size
        num_tokens = req.num_known_tokens
        hits: list[int] = []
        num_null = 0  # leading hit entries outside the first query's window (null blocks)
        # Prompt logprobs need every prompt position computed, so such requests skip the cache.
        if cfg.enable_prefix_caching and req.sampling.prompt_logprobs is None:
            # Leave at least the last token to compute: its logits give the next token.
            max_hits = (num_tokens - 1) // bs
            req.extend_block_keys(max_hits * bs, bs)
            if self._window:
                hits, num_null = find_window_hit(pool, req.block_keys, max_hits, self._window)
            else:
                hits = pool.find_cached_prefix(req.block_keys, max_hits)
        held = hits[num_null:] if num_null else hits
        start = len(hits) * bs
        n = min(num_tokens - start, budget)
        if req.sampling.prompt_logprobs is not None:
            n = req.cap_at_logprobs_mark(start, n)
        end = start + n
        need = (end + bs - 1) // bs - len(hits)
        if need + pool.num_free_among(held) > pool.num_free_blocks:
            return None
        pool.touch(held)  # before allocate, which could otherwise evict a hit
        new_blocks = pool.allocate(need)
        if cfg.enable_prefix_caching:
            pool.record_query(num_tokens, start)
        if not req.admitted:
            req.admitted = True
            req.num_cached_tokens = start
        slot = heappop(self._free_slots)
        req.slot = slot
        req.status = RUNNING
        req.block_ids = hits + new_blocks
        req.num_registered_blocks = len(hits)
        req.num_released_blocks = num_null
        req.num_computed_tokens = end
        if self._window:
            req.chunks_in_flight.append((step_id, start))
        req.num_placeholders = int(end == num_tokens)
        insort(self.running, req, key=_order)
        seat = SeatedRequest(
            slot, req.all_token_ids(), len(req.prompt_token_ids), req.sampling, req.seed, hits
        )
        want_plp = req.take_prompt_logprobs(start, end)
        return seat, Chunk(slot, start, n, new_blocks, end == num_tokens, want_plp)

    def _preempt_for(self, need: int, index: int) -> bool:
        """Preempt from the tail of running until `need` blocks are free.

        The tail is the lowest priority, newest request, never one already scheduled in this
        step (those sit before `index`). Returns False if running[index] itself was preempted.
        """
        running = self.running
        while need > self.pool.num_free_blocks:
            victim_index = len(running) - 1
            self._preempt(running.pop())
            if victim_index == index:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        """Back to the queue by recompute: blocks and slot go, known tokens stay.

        A token in flight stays a placeholder and lands as a real output (the synchronous
        executor would have produced it too); the request is seated again only after that.
        """
        self.pool.cache_full_blocks(req, req.num_computed_tokens)
        self._free_table(req)
        req.num_registered_blocks = 0
        req.num_computed_tokens = 0
        self._release_slot(req)
        req.status = RequestStatus.PREEMPTED
        insort(self.waiting, req, key=_order)
        self.num_preemptions += 1

    def _finish(self, req: Request, reason: str, stop_reason: int | str | None) -> None:
        if req.speculates:
            self.proposer.forget(req)
        if req.status == RUNNING:
            # Cached full blocks outlive the request in the prefix cache (refcount 0, free).
            self.pool.cache_full_blocks(req, req.num_computed_tokens)
            self._free_table(req)
            self._release_slot(req)
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        req.status = FINISHED
        req.finish_reason = reason
        req.stop_reason = stop_reason
        del self.requests[req.request_id]

    def _free_table(self, req: Request) -> None:
        blocks = req.block_ids
        self.pool.free(live_blocks(blocks) if req.num_released_blocks else blocks)
        req.block_ids = []
        if self._window:
            forget_window_state(req)

    def _release_outside_window(self) -> None:
        """Free every running request's blocks that no step in flight or still to come reads."""
        in_flight = self._in_flight
        oldest = in_flight[0][0] if in_flight else self._next_step_id
        pool, window, released = self.pool, self._window, self._released
        bs = pool.block_size
        for req in self.running:
            # blocks [0, end) lie wholly before every window still to come
            end = (first_query_to_come(req, oldest) - window + 1) // bs
            if end > req.num_released_blocks:
                release_outside_window(req, pool, end)
                released[req.slot] = end

    def _release_slot(self, req: Request) -> None:
        heappush(self._free_slots, req.slot)
        self._freed_slots.append(req.slot)
        req.slot = -1

    def check_invariants(self) -> None:
        """Raise AssertionError on the first broken invariant (tests call it every step)."""
        cfg, pool, running, waiting = self.config, self.pool, self.running, self.waiting
        pool.check()
        assert running == sorted(running, key=_order), "running out of order"
        assert waiting == sorted(waiting, key=_order), "waiting out of order"
        alive = running + waiting
        assert len(alive) == len(self.requests) == len({r.request_id for r in alive})
        assert all(self.requests.get(r.request_id) is r for r in alive), "lost request"
        slots = {r.slot for r in running} | set(self._free_slots)
        assert len(slots) == len(running) + len(self._free_slots) == cfg.max_num_seqs, "slots"
        assert set(self._freed_slots) <= set(self._free_slots), "freed slot still seated"
        in_flight: dict[int, list] = {}  # id(request) -> [request, number of its tokens]
        for _, samplers, _ in self._in_flight:
            for r in samplers:
                in_flight.setdefault(id(r), [r, 0])[1] += 1
        for r, num in in_flight.values():
            assert r.num_placeholders == num, f"{r.request_id}: placeholders {r.num_placeholders}"
        refs = [0] * pool.num_blocks
        bs = cfg.block_size
        for r in alive:
            assert id(r) in in_flight or r.num_placeholders == 0, f"{r.request_id}: placeholders"
            assert len(r.output_token_ids) + r.num_placeholders <= r.max_output_tokens
            assert r.num_registered_blocks * bs <= r.num_known_tokens, "placeholder cached"
            if r.status != RUNNING:
                assert r.slot == -1 and not r.block_ids and r.num_computed_tokens == 0
                continue
            assert len(r.block_ids) == -(-r.num_computed_tokens // bs), "block table size"
            num_drafts = len(r.drafts_in_flight)
            assert r.num_computed_tokens <= r.num_tokens + num_drafts <= cfg.max_model_len
            assert not r.num_placeholders or r.num_computed_tokens >= r.num_tokens - 1
            num_null = r.num_released_blocks
            assert not any(r.block_ids[:num_null]) and all(r.block_ids[num_null:]), "null entries"
            if num_null:  # every query still to come (uncollected chunks included)
                starts = [s for _, s in r.chunks_in_flight]
                assert starts == sorted(starts), "chunk starts out of order"
                first_query = min([r.num_computed_tokens, *starts])
                assert num_null * bs <= first_query - self._window + 1, "freed inside a window"
            for block in r.block_ids[num_null:]:
                refs[block] += 1
        assert refs == pool.ref_counts, "reference counts disagree with block tables"


def _delta(req: Request, new_token_ids: list[int], logprobs=None, prompt_logprobs=None) -> Delta:
    return Delta(
        request_id=req.request_id,
        token_ids=new_token_ids,
        finished=req.status == FINISHED,
        finish_reason=req.finish_reason,
        stop_reason=req.stop_reason,
        logprobs=logprobs or [],
        prompt_logprobs=prompt_logprobs or [],
        num_prompt_tokens=len(req.prompt_token_ids),
        num_cached_tokens=req.num_cached_tokens,
        num_output_tokens=len(req.output_token_ids),
    )


def _route_prompt_logprobs(result: StepResult, plp_slots: dict[int, Request]) -> dict:
    """request_id -> prompt logprobs of this step, for requests still alive."""
    routed = {}
    for slot, entries in result.prompt_logprobs.items():
        req = plp_slots.get(slot)
        if req is not None and req.status != FINISHED:
            routed[req.request_id] = entries
    return routed
