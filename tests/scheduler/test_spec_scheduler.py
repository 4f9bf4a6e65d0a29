"""Speculation in the scheduler against a fake executor that verifies drafts.

The fake's "model" is an order-2 Markov chain over a few tokens: the next token is a hash of
(seed, last two tokens), so outputs cycle and prompt lookup often proposes the right tokens,
and sometimes the wrong ones. The fake checks what FakeExecutor checks (every read token
known, every KV block holding this history) and rolls its block tables back as the runner
does. Outputs with speculation must equal outputs without it, at depth 1 and 2, under a KV
cache small enough to force preemptions.
"""

import random

import numpy as np
import pytest

from tests.scheduler.fake_executor import EOS, FakeExecutor, Workload, _rolling, _Slot, run
from vtllm.scheduler.config import SchedulerConfig
from vtllm.scheduler.plan import SampledToken, StepPlan, StepResult, TokenLogprobs
from vtllm.scheduler.request import Request
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.scheduler.scheduler import Scheduler
from vtllm.scheduler.speculative import TokenHistory, propose_ngram

VOCAB = 6  # ids 0..5; EOS is 1


class MarkovFake(FakeExecutor):
    def execute(self, plan: StepPlan) -> StepResult:
        bs = self.config.block_size
        for slot in plan.freed_slots:
            del self.slots[slot]
        for seat in plan.seated:
            assert seat.slot not in self.slots
            tokens = list(seat.token_ids)
            self.slots[seat.slot] = _Slot(
                seat.seed, seat.prompt_len, seat.sampling, tokens, _rolling(tokens), []
            )
            self.slots[seat.slot].blocks = list(seat.block_ids)
        assert sum(c.num_tokens for c in plan.chunks) <= self.config.max_num_batched_tokens
        sampled = []
        for chunk in plan.chunks:
            st = self.slots[chunk.slot]
            st.blocks.extend(chunk.new_block_ids)
            drafts = chunk.draft_token_ids
            start, end = chunk.start, chunk.start + chunk.num_tokens
            if drafts:
                assert chunk.sample and end - len(drafts) == len(st.tokens), "drafts misplaced"
                st.tokens += drafts
                st.hashes = _rolling(st.tokens)
            assert end <= len(st.tokens), "reads an unknown position"
            assert len(st.blocks) == -(-end // bs), "block table does not match the chunk"
            self._check_kv(st, start)
            for p in range(start, end):
                block = st.blocks[p // bs]
                if self.kv[block] is None:
                    self.kv[block] = [None] * bs
                self.kv[block][p % bs] = st.hashes[p]
            if not chunk.sample:
                continue
            first = end - len(drafts)
            del st.tokens[first:], st.hashes[first:]
            emitted = []
            for j in range(len(drafts) + 1):
                token = hash((st.seed, st.tokens[-2], st.tokens[-1])) % VOCAB
                st.tokens.append(token)
                st.hashes.append(hash((st.hashes[-1], token)))
                emitted.append(token)
                if j == len(drafts) or token != drafts[j]:
                    break
            if drafts:  # KV is valid up to the position before the last token
                del st.blocks[-(-(len(st.tokens) - 1) // bs) :]
            lps = [TokenLogprobs(t, -0.25 * t, 1, [], []) for t in emitted]
            want = st.sampling.logprobs is not None
            sampled.append(
                SampledToken(
                    chunk.slot,
                    emitted[0],
                    lps[0] if want else None,
                    emitted[1:],
                    lps[1:] if want else [],
                )
            )
        self.num_steps += 1
        return StepResult(plan.step_id, sampled, {})


def config(k: int, **kw) -> SchedulerConfig:
    base = dict(
        max_num_seqs=8,
        max_num_batched_tokens=32,
        max_model_len=96,
        block_size=4,
        num_blocks=26,  # preemptions: eight requests of up to 96 tokens do not fit
        eos_token_ids=(EOS,),
        num_speculative_tokens=k,
        prompt_lookup_min=1,
        prompt_lookup_max=3,
    )
    return SchedulerConfig(**(base | kw))


def workload(seed: int) -> tuple[Workload, set[str]]:
    rng = random.Random(seed)
    arrivals, abort_at = {}, {}
    for i in range(60):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 30))]
        max_tokens = rng.choice([None, 1, 3, rng.randint(1, 40)])
        sampling = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=rng.choice([0, 0, 3]) if max_tokens != 1 else 0,
            stop_token_ids=rng.choice([[], [4], [0, 4]]),
            ignore_eos=rng.random() < 0.5,
            logprobs=rng.choice([None, 0]),
        )
        req = Request(f"r{i}", prompt, sampling, seed=rng.getrandbits(32))
        arrivals.setdefault(rng.randint(0, 40), []).append(req)
        if rng.random() < 0.1:
            abort_at.setdefault(rng.randint(0, 80), []).append(req.request_id)
    return Workload(arrivals, abort_at), {r for rids in abort_at.values() for r in rids}


def _copy(work: Workload) -> Workload:
    arrivals = {
        t: [Request(r.request_id, r.prompt_token_ids, r.sampling, seed=r.seed) for r in reqs]
        for t, reqs in work.arrivals.items()
    }
    return Workload(arrivals, dict(work.abort_at))


def _run(work: Workload, k: int, depth: int, caching: bool = True):
    scheduler = Scheduler(config(k, enable_prefix_caching=caching))
    truncated = []  # (finish reason, stop reason) of verified runs cut short by a stop
    take = scheduler._take_speculated

    def spy(req, sampled):
        delta = take(req, sampled)
        if len(delta.token_ids) < 1 + len(sampled.more_ids):
            truncated.append((delta.finish_reason, delta.stop_reason))
        return delta

    scheduler._take_speculated = spy
    outcomes = run(scheduler, MarkovFake(scheduler.config), _copy(work), depth=depth)
    return outcomes, scheduler, truncated


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("caching", [True, False])
def test_speculation_changes_no_output(seed, depth, caching):
    work, aborted = workload(seed)
    plain, plain_scheduler, _ = _run(work, 0, 1, caching)
    spec, scheduler, truncated = _run(work, 3, depth, caching)
    assert plain_scheduler.spec_stats is None
    for rid, a in plain.items():
        b = spec[rid]
        if rid in aborted:  # a timed abort lands after a different number of tokens
            n = min(len(a.token_ids), len(b.token_ids))
            assert a.token_ids[:n] == b.token_ids[:n], rid
        else:
            assert (a.token_ids, a.finish_reason, a.stop_reason, a.logprobs) == (
                b.token_ids,
                b.finish_reason,
                b.stop_reason,
                b.logprobs,
            ), rid
    stats = scheduler.spec_stats
    assert stats.num_accepted_tokens > stats.num_drafts // 2 > 20, stats
    assert stats.num_draft_tokens > stats.num_accepted_tokens, "some drafts must be rejected"
    assert sum(stats.accepted_per_pos) == stats.num_accepted_tokens
    assert scheduler.num_preemptions > 0 and plain_scheduler.num_preemptions > 0


def test_stops_inside_accepted_runs_happen():
    truncated = []
    for seed in (1, 2):
        work, _ = workload(seed)
        truncated += _run(work, 3, 2)[2]
    assert ("stop", None) in truncated or ("stop", 4) in truncated, truncated


@pytest.mark.parametrize(
    "stop_ids, ignore_eos, min_tokens, kept, reason",
    [
        ([], False, 0, [2, EOS], None),  # eos inside the accepted run
        ([4], True, 0, [2, EOS, 4], 4),  # a stop id; eos ignored
        ([], False, 4, [2, EOS, 4, 2], "length"),  # eos before min_tokens is no stop
    ],
)
def test_stop_inside_an_accepted_run(stop_ids, ignore_eos, min_tokens, kept, reason):
    scheduler = Scheduler(config(3, max_num_batched_tokens=64, num_blocks=64))
    sampling = SamplingParams(
        max_tokens=5, stop_token_ids=stop_ids, ignore_eos=ignore_eos, min_tokens=min_tokens
    )
    req = Request("a", [3, 2, EOS, 4, 2, 9], sampling, seed=1)
    scheduler.add_request(req)
    plan = scheduler.schedule()
    scheduler.update(StepResult(plan.step_id, [SampledToken(0, 3)]))
    plan = scheduler.schedule()
    assert plan.chunks[0].draft_token_ids == [2, EOS, 4]
    # every draft accepted, then the target's own token
    (delta,) = scheduler.update(StepResult(plan.step_id, [SampledToken(0, 2, None, [EOS, 4, 2])]))
    assert delta.token_ids == kept and delta.finished
    if reason == "length":
        assert delta.finish_reason == "length"
    else:
        assert (delta.finish_reason, delta.stop_reason) == ("stop", reason)
    assert delta.num_output_tokens == len(kept) + 1 and not scheduler.requests
    assert scheduler.num_used_blocks == 0


def test_drafts_respect_max_tokens_and_budget():
    scheduler = Scheduler(config(4, max_num_batched_tokens=64, num_blocks=64))
    req = Request("a", [2, 3, 2, 3, 2, 3, 2], SamplingParams(max_tokens=3, ignore_eos=True), seed=1)
    scheduler.add_request(req)
    plan = scheduler.schedule()  # the prompt
    scheduler.update(StepResult(plan.step_id, [SampledToken(0, 3)]))
    plan = scheduler.schedule()
    (chunk,) = plan.chunks
    assert chunk.draft_token_ids == [2]  # two outputs left: one draft and the target's token
    assert scheduler.schedule() is None  # not planned again while its step is in flight
    scheduler.check_invariants()
    result = StepResult(plan.step_id, [SampledToken(0, 2, None, [4])])  # 2 accepted, then 4
    (delta,) = scheduler.update(result)
    assert delta.token_ids == [2, 4] and delta.finished and delta.finish_reason == "length"
    scheduler.check_invariants()


def test_depth_2_without_drafts_where_no_proposal_is_expected():
    """A token in flight and no drafts with it: where the known tokens end in an n-gram seen
    before, the request waits for the token (a proposal is likely); elsewhere it is planned
    again at once, at the placeholder's position, without drafts."""
    scheduler = Scheduler(config(3, max_num_batched_tokens=64, num_blocks=64))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    plain = Request("plain", [2, 3, 4, 5, 6], params, seed=1)
    repeats = Request("repeats", [7, 8, 9, 7, 8], params, seed=1)  # 7 8 occurred before
    scheduler.add_request(plain)
    scheduler.add_request(repeats)
    prompts = scheduler.schedule()
    (chunk,) = scheduler.schedule().chunks  # both prompts in flight
    assert (chunk.slot, chunk.start, chunk.num_tokens) == (plain.slot, 5, 1)
    assert chunk.draft_token_ids == [] and plain.num_placeholders == 2
    scheduler.check_invariants()
    scheduler.update(StepResult(prompts.step_id, [SampledToken(0, 10), SampledToken(1, 9)]))
    plan = scheduler.schedule()  # repeats: its token known, the lookup proposes 7 8 9 ...
    by_slot = {c.slot: c for c in plan.chunks}
    assert by_slot[repeats.slot].draft_token_ids == [7, 8, 9]
    assert (by_slot[plain.slot].start, by_slot[plain.slot].draft_token_ids) == (6, [])
    scheduler.check_invariants()


def test_rejected_positions_roll_back():
    scheduler = Scheduler(config(3, max_num_batched_tokens=64, num_blocks=64, block_size=2))
    prompt = [2, 3, 4, 2, 3]  # with the output 4, the suffix 2 3 4 occurred: proposes 2 3 4
    req = Request("a", prompt, SamplingParams(max_tokens=20, ignore_eos=True), seed=1)
    scheduler.add_request(req)
    plan = scheduler.schedule()
    scheduler.update(StepResult(plan.step_id, [SampledToken(0, 4)]))
    plan = scheduler.schedule()
    (chunk,) = plan.chunks
    assert (chunk.start, chunk.num_tokens, chunk.draft_token_ids) == (5, 4, [2, 3, 4])
    assert len(req.block_ids) == 5  # positions 0..8
    # the first draft is rejected: the target gives 5, one token, KV valid up to position 5
    (delta,) = scheduler.update(StepResult(plan.step_id, [SampledToken(0, 5)]))
    assert delta.token_ids == [5] and req.num_computed_tokens == 6 and len(req.block_ids) == 3
    assert scheduler.spec_stats.num_draft_tokens == 3 and scheduler.spec_stats.num_drafts == 1
    scheduler.check_invariants()


class _AnyConstraint:
    def accept(self, token: int) -> None:
        pass


def test_requests_with_constraints_do_not_speculate():
    scheduler = Scheduler(config(3, num_blocks=64))
    req = Request("a", [2, 3, 2, 3, 2], SamplingParams(max_tokens=8), seed=1)
    req.constraint = _AnyConstraint()  # masks need every earlier token
    scheduler.add_request(req)
    plan = scheduler.schedule()
    scheduler.update(StepResult(plan.step_id, [SampledToken(0, 3)]))
    plan = scheduler.schedule()
    assert plan.chunks[0].draft_token_ids == [] and not req.speculates


@pytest.mark.parametrize(
    "tokens, k, lo, hi, expected",
    [
        ([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2, 1, 3, [7, 1]),  # the most recent occurrence
        ([5, 1, 2, 8, 2, 6, 1, 2], 3, 1, 2, [8, 2, 6]),  # the longest n first (1, 2 beats 2)
        ([5, 1, 2, 8, 2, 6, 1, 2], 3, 1, 1, [6, 1, 2]),  # n = 1: the last 2 before the end
        ([4, 4, 4], 5, 1, 2, [4]),  # what follows may run into the suffix itself
        ([1, 2, 3, 4], 2, 1, 3, []),  # no earlier occurrence
        ([3, 7, 3], 2, 2, 3, []),  # shorter than min_n + 1 with a match
    ],
)
def test_propose_ngram(tokens, k, lo, hi, expected):
    assert propose_ngram(np.asarray(tokens, np.int32), k, lo, hi) == expected


def test_token_history_grows_by_new_tokens():
    history = TokenHistory(2)
    prompt, output = [1, 2, 3], []
    assert history.sync(prompt, output).tolist() == [1, 2, 3]
    output += list(range(40))
    assert history.sync(prompt, output).tolist() == prompt + output
