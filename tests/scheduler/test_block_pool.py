import pytest

from vtllm.scheduler.block_pool import NULL_BLOCK, BlockPool
from vtllm.scheduler.request import ROOT_HASH, Request
from vtllm.scheduler.sampling_params import SamplingParams

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
    order = list(pool._free)
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
    assert list(pool._free)[0] == b.block_ids[0]  # worthless copy is reused first
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
