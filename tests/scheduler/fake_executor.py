"""A pure-Python executor that honors vtllm.scheduler.plan exactly, and drivers that run a
scheduler against it synchronously or at depth 2.

The fake keeps the token mirror per slot and a simulated KV cache: every written KV entry is
the rolling hash of the token history up to its position. Before computing a chunk it checks
that every token it would read is in the mirror (the placeholder check) and that the slot's
block table holds the KV of exactly this history for every earlier position (the block,
prefix-cache and preemption check). The next token is a hash of (seed, history): it does not
depend on how the scheduler batched, chunked, cached or preempted, which makes the depth-2
law testable token for token.

`python -m tests.scheduler.fake_executor` prints the scheduler's CPU cost per step.
"""

import time
from collections import deque
from dataclasses import dataclass, field

from vtllm.scheduler.block_pool import NULL_BLOCK
from vtllm.scheduler.config import SchedulerConfig
from vtllm.scheduler.plan import SampledToken, StepPlan, StepResult, TokenLogprobs
from vtllm.scheduler.request import Request
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.scheduler.scheduler import Scheduler

ROOT = 0x0DDBA11
EOS = 1


@dataclass(slots=True)
class _Slot:
    seed: int
    prompt_len: int
    sampling: SamplingParams
    tokens: list[int]  # the mirror: token_ids[slot, :num_tokens]
    hashes: list[int]  # hashes[p]: rolling hash of tokens[: p + 1], what KV at p must hold
    blocks: list[int]


def _rolling(tokens: list[int]) -> list[int]:
    hashes, h = [], ROOT
    for token in tokens:
        h = hash((h, token))
        hashes.append(h)
    return hashes


class FakeExecutor:
    def __init__(self, config: SchedulerConfig, vocab_size: int = 48):
        self.config = config
        self.vocab_size = vocab_size
        self.slots: dict[int, _Slot] = {}
        self.kv: list[list | None] = [None] * config.num_blocks  # block -> entry per offset
        self.num_steps = 0
        self.num_sampled = 0

    def execute(self, plan: StepPlan) -> StepResult:
        cfg, bs = self.config, self.config.block_size
        for slot in plan.freed_slots:
            assert slot in self.slots, f"freed slot {slot} is not seated"
            del self.slots[slot]
        for seat in plan.seated:
            assert seat.slot not in self.slots, f"slot {seat.slot} seated twice"
            assert 0 <= seat.slot < cfg.max_num_seqs
            tokens = list(seat.token_ids)
            self.slots[seat.slot] = _Slot(
                seat.seed,
                seat.prompt_len,
                seat.sampling,
                tokens,
                _rolling(tokens),
                list(seat.block_ids),
            )
        assert sum(c.num_tokens for c in plan.chunks) <= cfg.max_num_batched_tokens, "budget"
        assert len({c.slot for c in plan.chunks}) == len(plan.chunks), "two chunks, one slot"
        sampled, prompt_logprobs = [], {}
        for chunk in plan.chunks:
            st = self.slots[chunk.slot]
            assert NULL_BLOCK not in chunk.new_block_ids, "null block handed out"
            st.blocks.extend(chunk.new_block_ids)
            start, end = chunk.start, chunk.start + chunk.num_tokens
            assert chunk.num_tokens >= 1
            assert end <= len(st.tokens), f"slot {chunk.slot} reads position {end - 1} unknown"
            assert len(st.blocks) == -(-end // bs), "block table does not match the chunk"
            self._check_kv(st, start)
            for p in range(start, end):
                block = st.blocks[p // bs]
                if self.kv[block] is None:
                    self.kv[block] = [None] * bs
                self.kv[block][p % bs] = st.hashes[p]
            if chunk.prompt_logprobs:
                prompt_logprobs[chunk.slot] = [
                    TokenLogprobs(st.tokens[p], -(st.hashes[p] % 997) / 100, 1, [], [])
                    for p in range(start, min(end, st.prompt_len))
                ]
            if chunk.sample:
                assert end == len(st.tokens), "sampling before the last token"
                x = hash((st.seed, st.hashes[-1])) & 0xFFFFFFFFFFFF
                token = x % self.vocab_size
                st.tokens.append(token)
                st.hashes.append(hash((st.hashes[-1], token)))
                logprobs = None
                if st.sampling.logprobs is not None:
                    k = st.sampling.logprobs
                    top = [(x >> (4 * i)) % self.vocab_size for i in range(k)]
                    logprob = -((x >> 8) % 1000) / 100
                    logprobs = TokenLogprobs(token, logprob, 1 + (x >> 20) % 3, top, [logprob] * k)
                sampled.append(SampledToken(chunk.slot, token, logprobs))
                self.num_sampled += 1
        self.num_steps += 1
        return StepResult(plan.step_id, sampled, prompt_logprobs)

    def _check_kv(self, st: _Slot, start: int) -> None:
        """KV of positions [0, start) must be this slot's history, block by block."""
        bs = self.config.block_size
        for i in range(-(-start // bs)):
            lo, hi = i * bs, min((i + 1) * bs, start)
            kv = self.kv[st.blocks[i]]
            assert kv is not None and kv[: hi - lo] == st.hashes[lo:hi], (
                f"block {st.blocks[i]} does not hold positions {lo}..{hi - 1} of this history"
            )


def reference_tokens(seed: int, prompt: list[int], n: int, vocab_size: int = 48) -> list[int]:
    """The first n tokens the fake samples for this seed and prompt, without any scheduler."""
    hashes = _rolling(prompt)
    h, out = hashes[-1], []
    for _ in range(n):
        token = (hash((seed, h)) & 0xFFFFFFFFFFFF) % vocab_size
        out.append(token)
        h = hash((h, token))
    return out


@dataclass
class Outcome:
    token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list = field(default_factory=list)
    prompt_logprobs: list = field(default_factory=list)
    num_cached_tokens: int = 0


@dataclass
class Workload:
    """What happens when: arrivals and timed aborts by loop iteration; progress-based aborts
    and stop strings by output, so they hit the same token in every mode."""

    arrivals: dict[int, list[Request]] = field(default_factory=dict)
    abort_at: dict[int, list[str]] = field(default_factory=dict)
    abort_after: dict[str, int] = field(default_factory=dict)  # request_id -> output tokens
    # A token of the first set followed by one of the second acts as a stop string.
    stop_pair: tuple[frozenset[int], frozenset[int]] | None = None


def _ends_with_pair(tokens: list[int], pair: tuple[frozenset[int], frozenset[int]]) -> bool:
    return len(tokens) >= 2 and tokens[-2] in pair[0] and tokens[-1] in pair[1]


def run(
    scheduler: Scheduler,
    executor: FakeExecutor,
    workload: Workload,
    depth: int = 1,
    check: bool = True,
    on_step=None,
    max_iterations: int = 100_000,
) -> dict[str, Outcome]:
    """Drive to completion: schedule (launch) N+1, then update N once `depth` are in flight.

    depth=1 is the synchronous executor; 2 is the real one; 3 stresses the bookkeeping.
    """
    arrivals = dict(workload.arrivals)
    abort_at = dict(workload.abort_at)
    outcomes: dict[str, Outcome] = {}

    def consume(deltas):
        seen = set()
        for d in deltas:
            assert d.request_id not in seen, "two deltas for one request in one update"
            seen.add(d.request_id)
            o = outcomes[d.request_id]
            assert not o.finished, f"{d.request_id}: output after it finished"
            o.token_ids += d.token_ids
            assert d.num_output_tokens == len(o.token_ids)
            o.logprobs += d.logprobs or []
            o.prompt_logprobs += d.prompt_logprobs or []
            o.num_cached_tokens = d.num_cached_tokens
            if d.finished:
                o.finished, o.finish_reason, o.stop_reason = True, d.finish_reason, d.stop_reason
            elif workload.stop_pair and _ends_with_pair(o.token_ids, workload.stop_pair):
                consume_one(scheduler.finish_request(d.request_id, "stop", "<pair>"))
            elif len(o.token_ids) >= workload.abort_after.get(d.request_id, 1 << 62):
                consume_one(scheduler.abort_request(d.request_id))

    def consume_one(delta):
        assert delta is not None and delta.finished and not delta.token_ids
        o = outcomes[delta.request_id]
        o.finished, o.finish_reason, o.stop_reason = True, delta.finish_reason, delta.stop_reason

    pending: deque[StepResult] = deque()
    for it in range(max_iterations):
        for req in arrivals.pop(it, ()):
            scheduler.add_request(req)
            outcomes[req.request_id] = Outcome()
        for rid in abort_at.pop(it, ()):
            delta = scheduler.abort_request(rid)
            if delta is not None:
                consume_one(delta)
        if not scheduler.has_work() and not pending:
            if not arrivals:
                break
            continue
        plan = scheduler.schedule()
        if check:
            scheduler.check_invariants()
        if plan is not None:
            pending.append(executor.execute(plan))
        if pending and (len(pending) >= depth or plan is None):
            consume(scheduler.update(pending.popleft()))
        elif plan is None:
            raise AssertionError(f"stuck: {scheduler.num_waiting} waiting, nothing planned")
        if check:
            scheduler.check_invariants()
        if on_step is not None:
            on_step(scheduler, plan)
    else:
        raise AssertionError("did not finish")
    assert not scheduler.requests and scheduler.num_used_blocks == 0, "blocks left in use"
    assert sum(scheduler.pool.ref_counts) == 0
    return outcomes


def benchmark(num_requests: int = 64, num_steps: int = 2000, depth: int = 2) -> float:
    """Microseconds of schedule() + update() per decode step with num_requests running."""
    cfg = SchedulerConfig(
        max_num_seqs=num_requests,
        max_num_batched_tokens=8192,
        max_model_len=8192,
        num_blocks=num_requests * 160 + 1,
        eos_token_ids=(EOS,),
    )
    sched = Scheduler(cfg)
    sampling = SamplingParams(max_tokens=num_steps + 100, ignore_eos=True)
    for i in range(num_requests):
        sched.add_request(Request(f"r{i}", [7] * (100 + i), sampling, seed=i))
    pending, elapsed, steps = deque(), 0.0, 0
    for step in range(num_steps):
        t0 = time.perf_counter()
        plan = sched.schedule()
        t1 = time.perf_counter()
        result = StepResult(
            plan.step_id, [SampledToken(c.slot, 5) for c in plan.chunks if c.sample]
        )
        pending.append(result)
        t2 = time.perf_counter()
        if len(pending) >= depth:
            sched.update(pending.popleft())
        t3 = time.perf_counter()
        if step >= 10:  # steady state: every request decoding
            elapsed += (t1 - t0) + (t3 - t2)
            steps += 1
    return elapsed / steps * 1e6


if __name__ == "__main__":
    for depth in (1, 2):
        print(f"depth {depth}: {benchmark(depth=depth):.0f} us per step (64 running)")
