"""The one law: depth 2 gives the synchronous executor's output, token for token.

Randomized workloads (mixed prompts sharing prefixes, random max/min tokens, stop ids, eos,
priorities, logprobs, aborts, stop strings) under a KV cache small enough to force
preemptions, with prefix caching on and off. The fake executor asserts every read is of a
known token and every KV block holds the right history; the driver checks the scheduler's
invariants after every step.
"""

import random

import pytest

from tests.scheduler.fake_executor import EOS, FakeExecutor, Workload, run
from vtllm.scheduler.config import SchedulerConfig
from vtllm.scheduler.request import Request, RequestStatus
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.scheduler.scheduler import Scheduler

MAX_MODEL_LEN = 96
BS = 4


def make_workload(seed: int, num_requests: int = 72) -> tuple[Workload, set[str]]:
    """The workload and the ids aborted by the clock (their length depends on timing)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(2, 48) for _ in range(40)] for _ in range(3)]
    arrivals: dict[int, list[Request]] = {}
    abort_at: dict[int, list[str]] = {}
    abort_after: dict[str, int] = {}
    for i in range(num_requests):
        rid = f"r{i}"
        head = rng.choice(prefixes)[: rng.choice([0, 8, 17, 40])]
        prompt = head + [rng.randrange(2, 48) for _ in range(rng.randint(1, 30))]
        room = MAX_MODEL_LEN - len(prompt)
        max_tokens = rng.choice([None, 1, 2, rng.randint(1, room)])
        min_tokens = rng.randint(0, max_tokens) if max_tokens and rng.random() < 0.3 else 0
        sampling = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            stop_token_ids=rng.sample(range(2, 48), rng.choice([0, 0, 1, 2])),
            ignore_eos=rng.random() < 0.25,
            logprobs=rng.choice([None, None, 0, 2]),
            prompt_logprobs=rng.choice([None] * 5 + [0]),
        )
        req = Request(
            rid, prompt, sampling, seed=rng.getrandbits(63), priority=rng.choice([0, 0, 1, -1])
        )
        arrivals.setdefault(rng.randint(0, 60), []).append(req)
        roll = rng.random()
        if roll < 0.1:
            abort_after[rid] = rng.randint(1, 12)
        elif roll < 0.2:
            abort_at.setdefault(rng.randint(0, 120), []).append(rid)
    workload = Workload(
        arrivals, abort_at, abort_after, stop_pair=(frozenset(range(2, 7)), frozenset(range(7, 12)))
    )
    return workload, {rid for rids in abort_at.values() for rid in rids}


def fresh(workload: Workload) -> Workload:
    """Requests are mutable state: every run gets its own copies."""
    arrivals = {
        it: [
            Request(r.request_id, list(r.prompt_token_ids), r.sampling, r.seed, r.priority)
            for r in reqs
        ]
        for it, reqs in workload.arrivals.items()
    }
    return Workload(arrivals, workload.abort_at, workload.abort_after, workload.stop_pair)


def simulate(workload, depth, caching, num_blocks, stats):
    cfg = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=32,
        max_model_len=MAX_MODEL_LEN,
        block_size=BS,
        num_blocks=num_blocks,
        enable_prefix_caching=caching,
        eos_token_ids=(EOS,),
    )
    sched = Scheduler(cfg)

    schedule = sched.schedule

    def schedule_and_watch():
        plan = schedule()
        # Preempted while its token was in flight: the interaction the law must survive.
        if any(r.status == RequestStatus.PREEMPTED and r.num_placeholders for r in sched.waiting):
            stats["preempted_in_flight"] += 1
        return plan

    sched.schedule = schedule_and_watch
    outcomes = run(sched, FakeExecutor(cfg), fresh(workload), depth=depth)
    stats["preemptions"] += sched.num_preemptions
    stats["hit_tokens"] += sched.pool.num_hit_tokens
    return {
        rid: (o.token_ids, o.finish_reason, o.stop_reason, o.logprobs, o.prompt_logprobs)
        for rid, o in outcomes.items()
    }


def assert_same(a: dict, b: dict, timed: set[str]):
    assert a.keys() == b.keys()
    for rid in a:
        if rid not in timed:
            assert a[rid] == b[rid], rid
            continue
        # Aborted by the clock: one output is a prefix of the other, and only an abort ends
        # an output early.
        (ta, ra, *_), (tb, rb, *_) = a[rid], b[rid]
        short, long_ = sorted([(ta, ra), (tb, rb)], key=lambda x: len(x[0]))
        assert long_[0][: len(short[0])] == short[0], rid
        assert short[1] == "abort" or short == long_, rid


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("num_blocks", [25, 200])  # 24 usable blocks: one longest request
def test_depth2_equals_sync(seed, num_blocks):
    workload, timed = make_workload(seed)
    stats = dict(preemptions=0, hit_tokens=0, preempted_in_flight=0)
    runs = {
        (caching, depth): simulate(workload, depth, caching, num_blocks, stats)
        for caching in (False, True)
        for depth in (1, 2, 3)
    }
    reference = runs[(False, 1)]
    for outcome in runs.values():
        assert_same(reference, outcome, timed)
    reasons = {r[1] for r in reference.values()}
    assert {"stop", "length", "abort"} <= reasons
    stop_reasons = {type(r[2]) for r in reference.values() if r[1] == "stop"}
    assert stop_reasons == {int, str, type(None)}  # stop id, stop string, eos
    assert stats["hit_tokens"] > 0
    if num_blocks == 25:
        assert stats["preemptions"] > 0


@pytest.mark.parametrize("depth", [2, 3])
def test_preemption_with_a_token_in_flight_happens(depth):
    """The tiny cache must reach the placeholder + preemption path somewhere."""
    stats = dict(preemptions=0, hit_tokens=0, preempted_in_flight=0)
    for seed in range(3):
        workload, _ = make_workload(seed)
        simulate(workload, depth, True, 25, stats)
    assert stats["preempted_in_flight"] > 0
