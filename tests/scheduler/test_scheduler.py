import random
import zlib

import pytest

from tests.scheduler.fake_executor import EOS, FakeExecutor, Workload, reference_tokens, run
from vtllm.errors import ContextLengthExceeded, InvalidParameter, RequestRejected
from vtllm.scheduler.config import SchedulerConfig
from vtllm.scheduler.request import Request, RequestStatus
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.scheduler.scheduler import Scheduler


def config(**kw) -> SchedulerConfig:
    base = dict(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=256,
        block_size=4,
        num_blocks=257,
        eos_token_ids=(EOS,),
    )
    return SchedulerConfig(**(base | kw))


def request(rid, prompt, seed=None, priority=0, **sampling) -> Request:
    seed = zlib.crc32(rid.encode()) if seed is None else seed  # str hash() is per process
    return Request(rid, list(prompt), SamplingParams(**sampling), seed=seed, priority=priority)


def prompt(n, salt=0):
    return [(7 * i + salt) % 40 + 2 for i in range(n)]


def simulate(cfg, requests, depth=1, workload=None, on_step=None):
    sched, ex = Scheduler(cfg), FakeExecutor(cfg)
    workload = workload or Workload()
    if requests:
        workload.arrivals = {0: requests}
    return run(sched, ex, workload, depth=depth, on_step=on_step), sched, ex


def expected(req: Request, cfg: SchedulerConfig):
    """The oracle: tokens, finish reason, stop reason from the fake's stream alone."""
    s = req.sampling
    room = cfg.max_model_len - len(req.prompt_token_ids)
    max_out = room if s.max_tokens is None else s.max_tokens
    stop_ids = set(s.stop_token_ids) | (set() if s.ignore_eos else set(cfg.eos_token_ids))
    tokens = reference_tokens(req.seed, req.prompt_token_ids, max_out)
    for i, token in enumerate(tokens, 1):
        if token in stop_ids and i >= s.min_tokens:
            return tokens[:i], "stop", token if token in s.stop_token_ids else None
        if i >= max_out:
            return tokens[:i], "length", None


def record_plans(sched):
    """Wrap schedule() to log each plan with the slot -> request_id map at planning time."""
    log, schedule = [], sched.schedule

    def logged():
        plan = schedule()
        if plan is not None:
            log.append((plan, {r.slot: r.request_id for r in sched.running}))
        return plan

    sched.schedule = logged
    return log


def check_oracle(outcomes, requests, cfg):
    for req in requests:
        o = outcomes[req.request_id]
        assert (o.token_ids, o.finish_reason, o.stop_reason) == expected(req, cfg), req.request_id


@pytest.mark.parametrize("depth", [1, 2])
def test_stop_conditions_match_oracle(depth):
    rng = random.Random(5)
    cfg = config()
    reqs = []
    for i in range(40):
        sampling = dict(
            max_tokens=rng.choice([None, 1, 5, 30, 80]),
            stop_token_ids=rng.sample(range(2, 48), rng.choice([0, 1, 3])),
            ignore_eos=rng.random() < 0.3,
        )
        if sampling["max_tokens"] is not None:
            sampling["min_tokens"] = rng.randint(0, sampling["max_tokens"])
        reqs.append(request(f"r{i}", prompt(rng.randint(1, 170), i), **sampling))
    outcomes, _, _ = simulate(cfg, reqs, depth)
    check_oracle(outcomes, reqs, cfg)
    reasons = {(o.finish_reason, o.stop_reason is None) for o in outcomes.values()}
    assert {("stop", True), ("stop", False), ("length", True)} <= reasons


def test_min_tokens_boundary():
    """vLLM's rule: a stop token ends the request once it has min_tokens outputs, itself
    included; an earlier one is an ordinary token."""
    seed = next(
        s
        for s in range(5000)
        if reference_tokens(s, prompt(4), 6)[5:] == [EOS]
        and EOS not in reference_tokens(s, prompt(4), 5)
    )
    for min_tokens, stops_at in ((6, 6), (7, None)):
        req = request("a", prompt(4), seed=seed, max_tokens=30, min_tokens=min_tokens)
        outcomes, _, _ = simulate(config(), [req])
        o = outcomes["a"]
        assert o.token_ids[5] == EOS
        if stops_at:
            assert len(o.token_ids) == stops_at and o.finish_reason == "stop"
        else:
            assert len(o.token_ids) > 6


def test_max_model_len_caps_output():
    cfg = config()
    req = request("a", prompt(250), max_tokens=None, ignore_eos=True)
    outcomes, _, _ = simulate(cfg, [req])
    assert len(outcomes["a"].token_ids) == 6 and outcomes["a"].finish_reason == "length"


def test_chunked_prefill_keeps_decodes_running():
    cfg = config(max_num_batched_tokens=16, max_num_seqs=4)
    sched, ex = Scheduler(cfg), FakeExecutor(cfg)
    log = record_plans(sched)
    shorts = [request(f"s{i}", prompt(3, i), max_tokens=60, ignore_eos=True) for i in range(3)]
    # Higher priority: it sits before the decodes in running order, yet must not starve them.
    long = request("long", prompt(100), priority=-1, max_tokens=3, ignore_eos=True)
    outcomes = run(sched, ex, Workload(arrivals={0: shorts, 3: [long]}))
    long_chunks = []
    for plan, slot_to_id in log:
        by_id = {slot_to_id[c.slot]: c for c in plan.chunks}
        assert sum(c.num_tokens for c in plan.chunks) <= 16
        sizes = [c.num_tokens for c in plan.chunks]
        assert sizes == sorted(sizes, key=lambda n: n > 1), "decode chunks lead the step"
        if "long" in by_id and by_id["long"].start < 100:
            long_chunks.append(by_id["long"])
            assert all(by_id[s.request_id].num_tokens == 1 for s in shorts), "decode stalled"
    assert len(long_chunks) >= 8  # 100 tokens under a budget of 16 - 3 decodes
    assert [c.start for c in long_chunks] == [0] + [
        sum(c.num_tokens for c in long_chunks[:k]) for k in range(1, len(long_chunks))
    ]
    assert [c.sample for c in long_chunks] == [False] * (len(long_chunks) - 1) + [True]
    check_oracle(outcomes, shorts + [long], cfg)


def test_seat_cap_and_budget_every_step():
    cfg = config(max_num_seqs=3, max_num_batched_tokens=10)
    reqs = [request(f"r{i}", prompt(5 + i, i), max_tokens=8) for i in range(12)]

    def on_step(sched, plan):
        assert sched.num_running <= 3

    outcomes, _, ex = simulate(cfg, reqs, depth=2, on_step=on_step)
    check_oracle(outcomes, reqs, cfg)  # the fake asserts the budget and slot range


def test_priority_then_fcfs():
    cfg = config(max_num_seqs=1)
    sched, ex = Scheduler(cfg), FakeExecutor(cfg)
    log = record_plans(sched)
    pri = {"a": 1, "b": 0, "c": 0, "d": 1, "e": -1}
    reqs = [request(rid, prompt(4), priority=p, max_tokens=2) for rid, p in pri.items()]
    run(sched, ex, Workload(arrivals={0: reqs}))
    order = [slot_to_id[s.slot] for plan, slot_to_id in log for s in plan.seated]
    assert order == ["e", "b", "c", "a", "d"]


def test_admission_rejection_allocates_nothing():
    cfg = config(max_model_len=64, num_blocks=9)  # 8 usable blocks = 32 tokens
    sched = Scheduler(cfg)
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 64"):
        sched.add_request(request("a", prompt(60), max_tokens=10))
    with pytest.raises(ContextLengthExceeded) as err:
        sched.add_request(request("b", prompt(64), max_tokens=None))
    assert err.value.param == "prompt"
    with pytest.raises(RequestRejected, match="KV-cache blocks"):
        sched.add_request(request("c", prompt(40), max_tokens=4))
    with pytest.raises(RequestRejected):  # prompt fits, but max_tokens could outgrow the cache
        sched.add_request(request("d", prompt(20), max_tokens=20))
    with pytest.raises(InvalidParameter):
        sched.add_request(request("e", [], max_tokens=4))
    assert not sched.has_work() and sched.pool.num_free_blocks == 8 and sched.schedule() is None
    sched.add_request(request("ok", prompt(20), max_tokens=13))  # 32 tokens: exactly fits
    with pytest.raises(RequestRejected, match="already added"):
        sched.add_request(request("ok", prompt(2)))
    sched.check_invariants()


def _step(sched, ex):
    plan = sched.schedule()
    return sched.update(ex.execute(plan)) if plan is not None else None


def test_abort_unknown_and_finished_is_noop():
    cfg = config()
    sched, ex = Scheduler(cfg), FakeExecutor(cfg)
    assert sched.abort_request("nope") is None
    sched.add_request(request("a", prompt(4), max_tokens=1))
    (delta,) = _step(sched, ex)
    assert delta.finished and sched.abort_request("a") is None
    assert not sched.has_work()
    sched.check_invariants()


@pytest.mark.parametrize("caching", [False, True])
def test_abort_waiting_mid_prefill_and_decoding_frees_everything(caching):
    cfg = config(max_num_seqs=1, max_num_batched_tokens=8, enable_prefix_caching=caching)
    sched, ex = Scheduler(cfg), FakeExecutor(cfg)
    sched.add_request(request("a", prompt(30), max_tokens=50, ignore_eos=True))
    sched.add_request(request("b", prompt(5), max_tokens=50))
    assert _step(sched, ex) == []  # a's first chunk of 8
    delta = sched.abort_request("b")  # waiting
    assert delta.finished and delta.finish_reason == "abort" and sched.num_waiting == 0
    used = sched.num_used_blocks
    assert used == 2
    delta = sched.abort_request("a")  # mid-prefill
    assert (delta.finish_reason, delta.num_output_tokens) == ("abort", 0)
    assert sched.num_used_blocks == 0 and not sched.has_work()
    sched.check_invariants()
    sched.add_request(request("c", prompt(6), max_tokens=50, ignore_eos=True))
    plan = sched.schedule()
    assert plan.freed_slots == [0] and plan.seated[0].slot == 0
    sched.update(ex.execute(plan))
    for _ in range(3):
        (delta,) = _step(sched, ex)
    assert delta.num_output_tokens == 4
    plan = sched.schedule()  # depth 2: a decode in flight when the abort lands
    delta = sched.abort_request("c")
    assert delta.num_output_tokens == 4 and sched.num_used_blocks == 0
    assert sched.update(ex.execute(plan)) == []  # the late token is dropped
    assert not sched.has_work()
    sched.check_invariants()


def test_depth2_stop_discards_the_extra_token():
    cfg = config()
    seed = next(s for s in range(1000) if EOS in reference_tokens(s, prompt(4), 20)[2:20])
    req = request("a", prompt(4), seed=seed, max_tokens=20)
    outcomes, _, ex = simulate(cfg, [req], depth=2)
    o = outcomes["a"]
    assert o.finish_reason == "stop" and o.token_ids[-1] == EOS and o.stop_reason is None
    assert ex.num_sampled == len(o.token_ids) + 1


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_length_limit_computes_no_extra_token(depth):
    """Unlike a stop token, max_tokens is known ahead: nothing is sampled past it."""
    reqs = [request(f"r{i}", prompt(5, i), max_tokens=7, ignore_eos=True) for i in range(3)]
    outcomes, _, ex = simulate(config(), reqs, depth)
    assert ex.num_sampled == 21 and all(len(o.token_ids) == 7 for o in outcomes.values())


@pytest.mark.parametrize("depth", [1, 2])
def test_preemption_under_tiny_kv_budget(depth):
    cfg = config(max_model_len=64, num_blocks=17, max_num_batched_tokens=32)
    reqs = [request(f"r{i}", prompt(10 + i, i), max_tokens=30, ignore_eos=True) for i in range(8)]
    reqs[3].sampling.prompt_logprobs = 0
    outcomes, sched, _ = simulate(cfg, reqs, depth)
    assert sched.num_preemptions > 0
    check_oracle(outcomes, reqs, cfg)
    plp = outcomes["r3"].prompt_logprobs
    assert [e.token_id for e in plp] == reqs[3].prompt_token_ids  # none lost, none twice


def test_prompt_logprobs_and_logprobs_across_chunks():
    cfg = config(max_num_batched_tokens=8)
    req = request("a", prompt(30), max_tokens=5, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    outcomes, _, _ = simulate(cfg, [req], depth=2)
    o = outcomes["a"]
    assert [e.token_id for e in o.prompt_logprobs] == req.prompt_token_ids
    assert [e.token_id for e in o.logprobs] == o.token_ids and len(o.logprobs[0].top_ids) == 2


@pytest.mark.parametrize("depth", [1, 2])
def test_prefix_cache_hits_and_identical_outputs(depth):
    shared = prompt(40, 3)
    reqs = {
        caching: [request(f"r{i}", shared + prompt(i + 1, i), max_tokens=12) for i in range(6)]
        for caching in (False, True)
    }
    results = {}
    for caching in (False, True):
        cfg = config(enable_prefix_caching=caching)
        workload = Workload(arrivals={3 * i: [r] for i, r in enumerate(reqs[caching])})
        results[caching] = simulate(cfg, [], depth, workload)
    (off, sched_off, _), (on, sched_on, _) = results[False], results[True]
    assert {k: o.token_ids for k, o in off.items()} == {k: o.token_ids for k, o in on.items()}
    assert sched_off.pool.num_hit_tokens == 0
    assert sched_on.pool.num_hit_tokens >= 5 * 40 and sched_on.pool.num_query_tokens > 0
    assert on["r0"].num_cached_tokens == 0 and on["r5"].num_cached_tokens == 40
    # Everything finished: cached blocks stay in the pool at refcount 0.
    assert sched_on.pool.num_cached_blocks >= 10 and sched_on.num_used_blocks == 0


def test_request_status_and_seed():
    r = Request("x", [1, 2], SamplingParams())
    assert 0 <= r.seed < 1 << 63 and r.status == RequestStatus.WAITING
    assert Request("y", [1], SamplingParams(seed=-5)).seed == -5
