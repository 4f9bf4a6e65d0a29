import zlib

import pytest

from tests.scheduler.fake_executor import FakeExecutor, Workload, run
from vtllm.scheduler.block_pool import NULL_BLOCK, BlockPool
from vtllm.scheduler.config import SchedulerConfig
from vtllm.scheduler.request import ROOT_HASH, Request
from vtllm.scheduler.sampling_params import SamplingParams
from vtllm.scheduler.scheduler import Scheduler

BS = 4


def _request(tokens, output=()):
    req = Request("r", list(tokens), SamplingParams(), seed=0)
    req.output_token_ids = list(output)
    return req


def _seat(pool, req, num_computed):
    """Give req blocks for num_computed positions and register what is full and known."""
    req.block_ids = pool.allocate(-(-num_computed // BS))
    req.num_registered_blocks = 0
    pool.cache_full_blocks(req, num_computed)


def test_allocate_free_refcount_and_null_block():
    pool = BlockPool(9, BS)
    assert pool.num_usable_blocks == pool.num_free_blocks == 8
    blocks = pool.allocate(3)
    assert blocks == [1, 2, 3] and NULL_BLOCK not in blocks
    assert pool.num_used_blocks == 3 and pool.ref_counts[1] == 1
    pool.check()
    pool.free(blocks)
    assert pool.num_used_blocks == 0
    pool.check()
    with pytest.raises(RuntimeError):
        pool.free([1])  # double free
    with pytest.raises(RuntimeError):
        pool.allocate(9)
    with pytest.raises(RuntimeError):
        pool.free([NULL_BLOCK])
    pool.check()


def test_eviction_order_lru_and_uncached_first():
    pool = BlockPool(9, BS)
    a = _request(range(8))  # two full blocks, cached
    _seat(pool, a, 8)
    b = _request(range(100, 108))
    _seat(pool, b, 8)
    c = pool.allocate(1)  # holds nothing cacheable
    pool.free(a.block_ids)  # a's tail first: a[1] is evicted before a[0]
    pool.free(c)
    pool.free(b.block_ids)
    order = pool.allocation_order()
    # Uncached blocks at the head (c, then the never-used ones), then a's blocks tail-first,
    # then b's: least recently freed prefixes go first.
    assert order[0] == c[0]
    cached = [blk for blk in order if pool.block_to_key[blk] is not None]
    assert cached == [a.block_ids[1], a.block_ids[0], b.block_ids[1], b.block_ids[0]]
    # Reusing an evicted block drops its hash from the map.
    pool.allocate(len(order) - 4)  # all the uncached ones
    assert pool.num_cached_blocks == 4
    (evicted,) = pool.allocate(1)
    assert evicted == a.block_ids[1] and pool.block_to_key[evicted] is None
    assert pool.num_cached_blocks == 3
    pool.check()


def test_hash_chaining_and_prefix_lookup():
    pool = BlockPool(17, BS)
    a = _request(range(12))
    _seat(pool, a, 12)
    assert pool.num_cached_blocks == 3
    keys = a.block_keys
    assert keys[0] == (ROOT_HASH, (0, 1, 2, 3)) and keys[1][0] == hash(keys[0])
    # Same tokens in block 1 but a different block 0: no hit past block 0.
    b = _request([0, 1, 2, 3, 9, 9, 9, 9, 4, 5, 6, 7])
    b.extend_block_keys(12, BS)
    assert pool.find_cached_prefix(b.block_keys, 3) == [a.block_ids[0]]
    # The same second block content under another parent never matches.
    c = _request([9, 9, 9, 9, 4, 5, 6, 7])
    c.extend_block_keys(8, BS)
    assert pool.find_cached_prefix(c.block_keys, 2) == []
    # A prompt that spans prompt and output tokens keys the same as the flat sequence.
    d = _request(range(6), output=range(6, 12))
    d.extend_block_keys(12, BS)
    assert d.block_keys == keys
    assert pool.find_cached_prefix(d.block_keys, 2) == a.block_ids[:2]  # max_blocks honored
    pool.check()


def test_placeholders_and_partial_blocks_never_cached():
    pool = BlockPool(9, BS)
    req = _request(range(6))  # one full block + 2 tokens
    req.block_ids = pool.allocate(2)
    req.num_placeholders = 2  # positions 6, 7 exist only on the device
    pool.cache_full_blocks(req, 8)
    assert req.num_registered_blocks == 1 and pool.num_cached_blocks == 1
    req.output_token_ids = [6, 7]
    req.num_placeholders = 0
    pool.cache_full_blocks(req, 8)
    assert req.num_registered_blocks == 2 and pool.num_cached_blocks == 2
    pool.check()


def test_hit_on_free_block_leaves_free_list_and_refcounts_share():
    pool = BlockPool(9, BS)
    a = _request(range(8))
    _seat(pool, a, 8)
    pool.free(a.block_ids)
    assert pool.num_free_blocks == 8
    hits = pool.find_cached_prefix(a.block_keys, 2)
    assert pool.num_free_among(hits) == 2
    pool.touch(hits)
    assert pool.num_free_blocks == 6 and pool.num_free_among(hits) == 0
    pool.touch(hits)  # a second request shares them
    assert [pool.ref_counts[b] for b in hits] == [2, 2]
    pool.free(hits)
    pool.check()
    assert pool.num_used_blocks == 2
    pool.free(hits)
    assert pool.num_used_blocks == 0 and pool.num_cached_blocks == 2
    pool.check()


def test_first_writer_wins_and_hit_counters():
    pool = BlockPool(9, BS)
    a, b = _request(range(4)), _request(range(4))
    _seat(pool, a, 4)
    _seat(pool, b, 4)  # computed the same prefix without a hit: stays unregistered
    assert pool.num_cached_blocks == 1 and pool.block_to_key[b.block_ids[0]] is None
    pool.free(b.block_ids)
    assert pool.allocation_order()[0] == b.block_ids[0]  # worthless copy is reused first
    pool.record_query(10, 4)
    pool.record_query(6, 0)
    assert (pool.num_query_tokens, pool.num_hit_tokens) == (16, 4)
    pool.check()


def test_caching_disabled_registers_nothing():
    pool = BlockPool(9, BS, enable_caching=False)
    a = _request(range(8))
    _seat(pool, a, 8)
    assert pool.num_cached_blocks == 0 and a.block_keys == []
    assert pool.find_cached_prefix([(ROOT_HASH, (0, 1, 2, 3))], 1) == []


def _serve(pool, tokens):
    """One request served alone: hit its cached prefix, fill the rest, register, finish."""
    req = _request(tokens)
    req.extend_block_keys(len(tokens) // BS * BS, BS)
    hits = pool.find_cached_prefix(req.block_keys, len(tokens) // BS)
    pool.touch(hits)
    req.block_ids = hits + pool.allocate(-(-len(tokens) // BS) - len(hits))
    req.num_registered_blocks = len(hits)
    pool.cache_full_blocks(req, len(tokens))
    pool.free(req.block_ids)
    pool.check()
    return req.block_ids, len(hits)


@pytest.mark.parametrize("cap", [0, 5, 16, 40])
def test_distinct_prompts_stay_within_the_resident_cap(cap):
    """A long run of distinct prompts reuses resident blocks instead of fresh ones."""
    pool = BlockPool(1001, BS, resident_cap=cap)
    seen = set()
    for i in range(200):
        blocks, _ = _serve(pool, range(1000 * i, 1000 * i + 3 * BS))  # 3 full blocks each
        seen.update(blocks)
    # Past the cap only what one request needs at once (3 blocks) may be written.
    assert len(seen) == pool.num_resident_blocks == max(cap, 3)
    assert pool.num_free_blocks == 1000


def test_no_cap_keeps_every_prefix():
    """Without a cap (the GPU) never-written blocks come before evicting any cached prefix."""
    pool = BlockPool(1001, BS)
    seen = set()
    for i in range(200):
        seen.update(_serve(pool, range(1000 * i, 1000 * i + 3 * BS))[0])
    assert len(seen) == 600 and pool.num_cached_blocks == 600


def test_cached_prefixes_hit_while_the_cap_holds_them():
    pool = BlockPool(101, BS, resident_cap=12)
    first = range(2 * BS)
    _serve(pool, first)
    for i in range(1, 6):  # 10 more blocks: 12 resident, nothing evicted yet
        _serve(pool, range(100 * i, 100 * i + 2 * BS))
    assert pool.num_resident_blocks == 12 and pool.num_cached_blocks == 12
    assert _serve(pool, first)[1] == 2  # still cached, and now the most recently used
    _serve(pool, range(900, 900 + 2 * BS))  # evicts the oldest of the others, not `first`
    assert pool.num_resident_blocks == 12
    assert _serve(pool, first)[1] == 2 and _serve(pool, range(100, 100 + 2 * BS))[1] == 0


def test_shared_prefix_survives_a_long_run_of_distinct_suffixes():
    pool = BlockPool(1001, BS, resident_cap=8)
    system = list(range(-4 * BS, 0))  # a 4-block system prompt
    hits = [_serve(pool, system + list(range(10 * i, 10 * i + BS)))[1] for i in range(100)]
    assert hits == [0] + [4] * 99 and pool.num_resident_blocks == 8


def test_eviction_order_past_the_cap_is_lru_tail_first():
    pool = BlockPool(101, BS, resident_cap=6)
    a, b, c = _request(range(8)), _request(range(100, 108)), _request(range(200, 208))
    for req in (a, b, c):
        _seat(pool, req, 8)
    for req in (a, b, c):
        pool.free(req.block_ids)
    order = pool.allocation_order()
    assert order[:6] == [
        a.block_ids[1],
        a.block_ids[0],
        b.block_ids[1],
        b.block_ids[0],
        c.block_ids[1],
        c.block_ids[0],
    ]
    assert order[6:] == list(range(7, 101))  # never-written ones only past the cap
    taken = pool.allocate(3)  # a's tail, then its head, then b's tail
    assert taken == [a.block_ids[1], a.block_ids[0], b.block_ids[1]]
    assert pool.find_cached_prefix(a.block_keys, 2) == []
    assert pool.find_cached_prefix(b.block_keys, 2) == b.block_ids[:1]
    assert pool.find_cached_prefix(c.block_keys, 2) == c.block_ids
    assert pool.num_resident_blocks == 6
    pool.check()


def test_past_the_cap_only_when_nothing_resident_is_free():
    pool = BlockPool(21, BS, resident_cap=4)
    first = pool.allocate(6)  # (b) up to the cap, then (d)
    assert first == [1, 2, 3, 4, 5, 6] and pool.num_resident_blocks == 6
    pool.check()
    pool.free(first[:2])  # holding nothing: reused before anything else
    assert pool.allocate(2) == first[:2] and pool.num_resident_blocks == 6
    pool.free(first)
    assert sorted(pool.allocate(6)) == first and pool.num_resident_blocks == 6
    assert pool.allocate(2) == [7, 8]
    pool.check()


def test_check_catches_a_resident_set_grown_past_the_cap():
    pool = BlockPool(21, BS, resident_cap=2)
    pool.free(pool.allocate(2))
    pool.check()
    # As if allocate(3) had taken never-written blocks while two resident ones were free.
    pool._next_fresh = 6
    for block in (3, 4, 5):
        pool.ref_counts[block] = 1
    with pytest.raises(AssertionError, match="past the cap"):
        pool.check()


def test_scheduler_serving_distinct_prompts_stays_within_the_cap():
    """End to end: one request at a time, 120 distinct prompts, the pool's resident set stays
    at the cap (block 0 aside) while the budget is ten times larger."""
    cfg = SchedulerConfig(
        max_num_seqs=1,
        max_num_batched_tokens=64,
        max_model_len=64,
        block_size=BS,
        num_blocks=601,
        resident_blocks=24,
    )
    sched, ex = Scheduler(cfg), FakeExecutor(cfg)
    reqs = [
        Request(
            f"r{i}",
            [1000 + 20 * i + j for j in range(16)],
            SamplingParams(max_tokens=8, ignore_eos=True),
            seed=zlib.crc32(b"%d" % i),
        )
        for i in range(120)
    ]
    outcomes = run(sched, ex, Workload(arrivals={0: reqs}))
    assert all(len(o.token_ids) == 8 for o in outcomes.values())
    assert sched.pool.num_resident_blocks == 24 and sched.pool.num_cached_blocks > 0
