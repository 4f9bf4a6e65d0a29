"""Sliding-window block freeing (scheduler/sliding_window.py) against fakes that check it.

The fakes read what a windowed model reads: a chunk's rows look back `window` positions each,
so it checks that every position from its first row's window start holds this history (and
that none of it sits in a null entry), while blocks before that may be freed and reused by
anyone. The plan's released_blocks turn the fake's table entries into the null block, after a
check that no step still in flight read them (the depth-2 rule). Outputs must equal the oracle
and the runs without freeing, with chunked prefill, prefix-cache hits, preemptions,
speculation, at depth 1, 2 and 3.
"""

import random

import pytest
from msgspec.structs import replace

from tests.scheduler.fake_executor import FakeExecutor, Workload, run
from tests.scheduler.test_scheduler import check_oracle, config, prompt, request
from tests.scheduler.test_spec_scheduler import MarkovFake
from tests.scheduler.test_spec_scheduler import _copy as copy_workload
from tests.scheduler.test_spec_scheduler import config as spec_config
from tests.scheduler.test_spec_scheduler import workload as spec_workload
from vtllm.errors import RequestRejected
from vtllm.scheduler.block_pool import NULL_BLOCK, BlockPool
from vtllm.scheduler.plan import StepPlan, StepResult
from vtllm.scheduler.scheduler import Scheduler
from vtllm.scheduler.sliding_window import find_window_hit, peak_blocks, window_of_every_layer

WINDOW = 8  # two blocks of 4


class WindowChecks:
    """Mixin over a fake executor: windowed reads, released entries, reads in flight."""

    def __init__(self, scheduler: Scheduler):
        super().__init__(scheduler.config)
        self.scheduler = scheduler
        self.window = scheduler.config.sliding_window
        self.reads: dict[int, list] = {}  # step id -> (slot state, first position read)
        self.num_released = 0

    def execute(self, plan: StepPlan) -> StepResult:
        bs = self.config.block_size
        in_flight = {sid for sid, _, _ in self.scheduler._in_flight} - {plan.step_id}
        for slot, n in plan.released_blocks.items():  # before freed_slots, as the runner does
            st = self.slots[slot]
            for sid in in_flight:
                for reader, first in self.reads.get(sid, ()):
                    assert reader is not st or first >= n * bs, (
                        f"step {plan.step_id} freed blocks that step {sid} still reads"
                    )
            self.num_released += sum(b != NULL_BLOCK for b in st.blocks[:n])
            st.blocks[:n] = [NULL_BLOCK] * n
        result = super().execute(plan)
        self.reads[plan.step_id] = [
            (self.slots[c.slot], max(0, c.start - self.window + 1)) for c in plan.chunks
        ]
        self.reads = {sid: r for sid, r in self.reads.items() if sid >= plan.step_id - 4}
        return result

    def _check_kv(self, st, start: int) -> None:
        """The positions the chunk's first row reads must hold this history."""
        bs = self.config.block_size
        if start % bs:  # the chunk writes on into this block
            assert st.blocks[start // bs] != NULL_BLOCK, "writes into a freed entry"
        for p in range(max(0, start - self.window + 1), start):
            block = st.blocks[p // bs]
            assert block != NULL_BLOCK, f"position {p} inside the window was freed"
            kv = self.kv[block]
            assert kv is not None and kv[p % bs] == st.hashes[p], (
                f"block {block} lost position {p} of this history"
            )


class WindowFake(WindowChecks, FakeExecutor):
    pass


class WindowMarkovFake(WindowChecks, MarkovFake):
    pass


def simulate(cfg, work: Workload, depth=1, fake=WindowFake, on_step=None):
    sched = Scheduler(cfg)
    ex = fake(sched)
    return run(sched, ex, work, depth=depth, on_step=on_step), sched, ex


def mixed_work(seed: int, n: int = 24):
    """Prompts of up to seven windows, some sharing a 40-token prefix, arriving over time."""
    rng = random.Random(seed)
    shared = prompt(40, salt=3)
    arrivals, requests = {}, []
    for i in range(n):
        p = prompt(rng.randint(1, 56), salt=rng.randrange(40))
        if i % 3 == 0:
            p = shared + p[: rng.randint(1, 12)]
        req = request(f"r{i}", p, max_tokens=rng.randint(1, 60), ignore_eos=rng.random() < 0.5)
        requests.append(req)
        arrivals.setdefault(rng.randint(0, 30), []).append(req)
    return Workload(arrivals), requests


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("caching", [True, False])
def test_freeing_changes_no_output(depth, caching):
    """Chunked prefill (8 tokens a step), prefix hits and preemptions: with freeing, a pool
    of 13 blocks (52 tokens, where one request takes up to 40 blocks) serves what needs 29
    without; both runs give the oracle's tokens."""
    outcomes = {}
    for window, num_blocks in ((0, 30), (WINDOW, 14)):
        work, requests = mixed_work(seed=depth)
        cfg = config(
            num_blocks=num_blocks,
            max_num_batched_tokens=8,
            enable_prefix_caching=caching,
            sliding_window=window,
        )
        outcomes[window], sched, ex = simulate(cfg, work, depth)
        check_oracle(outcomes[window], requests, cfg)
        assert sched.num_preemptions > 0
        if window:
            assert ex.num_released > 200
            assert not caching or sched.pool.num_hit_tokens > 0
    for rid, a in outcomes[0].items():  # num_cached_tokens differ: hits differ
        b = outcomes[WINDOW][rid]
        assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason), rid


@pytest.mark.parametrize("depth", [1, 2])
def test_a_long_generation_gives_blocks_back(depth):
    """One request of 300 tokens: without freeing it needs 75 blocks; with a window of 8 it
    never holds more than ceil(8 / 4) + 1 while decoding (depth 2 included): the pool hands
    out five times its blocks, every one back from a window before."""
    cfg = config(num_blocks=16, max_num_batched_tokens=8, max_model_len=512, sliding_window=WINDOW)
    req = request("long", prompt(60), max_tokens=240, ignore_eos=True)
    used, handed_out, releases = [], [], []

    def on_step(sched, plan):
        used.append(sched.pool.num_used_blocks)
        if plan is not None:
            handed_out.extend(b for c in plan.chunks for b in c.new_block_ids)
            releases.extend(plan.released_blocks.values())

    outcomes, sched, _ = simulate(cfg, Workload({0: [req]}), depth, on_step=on_step)
    check_oracle(outcomes, [req], cfg)
    assert len(outcomes["long"].token_ids) == 240
    decode = used[len(used) // 2 :]
    assert max(decode) <= -(-WINDOW // 4) + 1, decode
    assert len(handed_out) == 75 and len(set(handed_out)) <= 15
    assert len(releases) > 50 and releases == sorted(releases)
    with pytest.raises(RequestRejected):  # the same pool without freeing
        Scheduler(replace(cfg, sliding_window=0)).add_request(req)


def test_sequences_far_longer_than_the_pool_complete():
    """Eight usable blocks (32 tokens) and three requests of 200 to 250 tokens at depth 2."""
    cfg = config(num_blocks=9, max_num_batched_tokens=8, sliding_window=WINDOW)
    reqs = [
        request(f"r{i}", prompt(40 + 10 * i, salt=i), max_tokens=160, ignore_eos=True)
        for i in range(3)
    ]
    outcomes, sched, _ = simulate(cfg, Workload({0: reqs}), depth=2)
    check_oracle(outcomes, reqs, cfg)
    assert all(len(o.token_ids) == 160 for o in outcomes.values())


def test_prefix_hit_after_its_first_blocks_were_evicted():
    """The first blocks of a finished request go back first (freed early, least recently),
    and other traffic evicts them; a request sharing its prefix still hits the blocks inside
    its window, and the fake checks their KV."""
    cfg = config(num_blocks=18, max_num_batched_tokens=64, sliding_window=WINDOW)
    shared = prompt(60, salt=5)
    first = request("first", shared, max_tokens=4, ignore_eos=True)
    other = request("other", prompt(40, salt=9), max_tokens=8)
    again = request("again", shared + [3, 4, 5], max_tokens=4)
    work = Workload({0: [first], 30: [other], 60: [again]})
    outcomes, sched, _ = simulate(cfg, work, depth=2)
    check_oracle(outcomes, [first, other, again], cfg)
    hit = outcomes["again"].num_cached_tokens
    assert hit == 60, hit  # a whole-prefix lookup would stop at the evicted first block
    pool = sched.pool
    assert first.block_keys[0] not in pool.key_to_block, "the first block should be evicted"


def test_speculation_with_freeing_changes_no_output():
    """n-gram drafts, rejected positions rolled back, preemptions, at depth 1 and 2."""
    work, aborted = spec_workload(1)
    plain = run(Scheduler(spec_config(0)), MarkovFake(spec_config(0)), copy_workload(work))
    for depth in (1, 2):
        cfg = spec_config(3, sliding_window=WINDOW)
        spec, sched, ex = simulate(cfg, copy_workload(work), depth, WindowMarkovFake)
        assert sched.spec_stats.num_draft_tokens > sched.spec_stats.num_accepted_tokens > 0
        assert ex.num_released > 50
        for rid, a in plain.items():
            b = spec[rid]
            if rid in aborted:
                n = min(len(a.token_ids), len(b.token_ids))
                assert a.token_ids[:n] == b.token_ids[:n], rid
            else:
                assert (a.token_ids, a.finish_reason) == (b.token_ids, b.finish_reason), rid


def test_find_window_hit():
    pool = BlockPool(16, 4)
    keys = [(i, (i,)) for i in range(8)]
    for i, block in ((1, 5), (2, 6), (3, 7), (5, 9), (6, 10)):
        pool.key_to_block[keys[i]] = block
    # window 8: a query at 4m reads blocks from (4m - 7) // 4 = m - 2 (m >= 2)
    assert find_window_hit(pool, keys, 8, 8) == ([0] * 5 + [9, 10], 5)  # m=8 needs 6, 7
    assert find_window_hit(pool, keys, 5, 8) == ([0, 0, 6, 7], 2)  # m=5 needs 3, 4
    assert find_window_hit(pool, keys, 3, 8) == ([0, 5, 6], 1)  # m=3 needs 1, 2
    assert find_window_hit(pool, keys, 2, 8) == ([], 0)  # m=2 needs 0, 1; m=1 needs 0
    pool.key_to_block[keys[0]] = 4
    assert find_window_hit(pool, keys, 2, 8) == ([4, 5], 0)
    assert find_window_hit(pool, keys, 7, 8) == ([0, 0, 0, 0, 0, 9, 10], 5)
    assert find_window_hit(pool, keys, 7, 100) == ([4, 5, 6, 7], 0)  # the whole prefix
    pool.enable_caching = False
    assert find_window_hit(pool, keys, 7, 8) == ([], 0)


def test_window_of_every_layer_and_peak_blocks():
    assert window_of_every_layer(4096, (True,) * 32, 32768) == 4096  # Mistral v0.1
    assert window_of_every_layer(4096, (True,) * 32, 4096) == 0  # never binds
    assert window_of_every_layer(4096, (True, False) * 13, 8192) == 0  # Gemma 2: global layers
    assert window_of_every_layer(4096, (), 8192) == 0
    assert window_of_every_layer(0, (False,) * 4, 8192) == 0
    assert peak_blocks(1000, 4, 0, 8) == 250
    assert peak_blocks(1000, 4, 8, 8) == -(-(7 + 16) // 4) + 1
    assert peak_blocks(10, 4, 8, 8) == 3
