"""KV-cache blocks: reference counts, free lists and the prefix cache of full blocks.

Block 0 is the null block: never allocated or freed, so the executor can point padded
block-table entries (and the KV writes of padded tokens) at it without harming anyone.

Allocation order, cheapest first:
  (a) freed blocks holding nothing (most recently freed first);
  (b) never-written blocks, while the resident set (blocks ever handed out) is below the cap;
  (c) freed blocks holding a cached prefix, least recently freed first (LRU eviction);
  (d) never-written blocks past the cap: the running requests need more than is resident.
On the CPU the KV cache is committed page by page as it is first written, so every
never-written block handed out grows the process for good; the cap bounds what the prefix
cache may keep resident, while (d) keeps the whole budget for requests that need it. Without
a cap (the GPU, where the cache is allocated up front) (b) always comes before (c), so cached
prefixes live as long as the budget allows. Never-written blocks are handed out in index
order, so the resident set is always blocks 1 .. num_resident_blocks.

Hot path: allocate/free/touch are O(blocks involved). Keep it lean; put features in helpers.
"""

from collections import OrderedDict

from vtllm.scheduler.request import Request

NULL_BLOCK = 0

BlockKey = tuple[int, tuple[int, ...]]  # (parent hash, token ids of the block)


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        resident_cap: int | None = None,
    ):
        self.num_blocks = num_blocks  # the null block included
        self.block_size = block_size
        self.enable_caching = enable_caching
        # Blocks that may be written before cached prefixes are evicted for room (None: all).
        usable = num_blocks - 1
        self.resident_cap = usable if resident_cap is None else max(0, min(resident_cap, usable))
        self.ref_counts = [0] * num_blocks
        self._empty: list[int] = []  # freed, holding nothing: a stack, (a)
        self._cached: OrderedDict[int, None] = OrderedDict()  # freed with a key, LRU first, (c)
        self._next_fresh = 1  # blocks >= this were never handed out, (b) and (d)
        self._peak_used = 0  # for check(): the resident set passes the cap only for these
        self.key_to_block: dict[BlockKey, int] = {}
        self.block_to_key: list[BlockKey | None] = [None] * num_blocks
        self.num_query_tokens = 0  # prefix-cache lookups, in tokens (metrics)
        self.num_hit_tokens = 0

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take, cached-but-unreferenced ones included."""
        return len(self._empty) + len(self._cached) + self.num_blocks - self._next_fresh

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - 1 - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self.key_to_block)

    @property
    def num_resident_blocks(self) -> int:
        """Blocks ever handed out: on the CPU, the KV pages the process has committed."""
        return self._next_fresh - 1

    def allocate(self, n: int) -> list[int]:
        """Take n blocks in the order of the module docstring, evicting cached prefixes."""
        if n > self.num_free_blocks:
            raise RuntimeError(f"allocate({n}) with {self.num_free_blocks} free blocks")
        empty = self._empty
        blocks = [empty.pop() for _ in range(min(n, len(empty)))]
        if len(blocks) < n:  # (b): never-written blocks up to the cap
            fresh = self._next_fresh
            take = min(n - len(blocks), max(0, self.resident_cap + 1 - fresh))
            blocks.extend(range(fresh, fresh + take))
            self._next_fresh = fresh + take
        if len(blocks) < n:  # (c): evict least recently used prefixes
            cached, block_to_key, key_to_block = self._cached, self.block_to_key, self.key_to_block
            for _ in range(min(n - len(blocks), len(cached))):
                block, _ = cached.popitem(last=False)
                del key_to_block[block_to_key[block]]
                block_to_key[block] = None
                blocks.append(block)
        if len(blocks) < n:  # (d): past the cap
            fresh = self._next_fresh
            self._next_fresh = fresh + n - len(blocks)
            blocks.extend(range(fresh, self._next_fresh))
        ref_counts = self.ref_counts
        for block in blocks:
            ref_counts[block] = 1
        used = self.num_used_blocks
        if used > self._peak_used:
            self._peak_used = used
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block; in reverse so a sequence's tail is evicted first."""
        ref_counts, block_to_key = self.ref_counts, self.block_to_key
        cached, empty = self._cached, self._empty
        for block in reversed(blocks):
            count = ref_counts[block] - 1
            if count < 0 or block == NULL_BLOCK:
                raise RuntimeError(f"double free of block {block}")
            ref_counts[block] = count
            if count == 0:
                # A block holding nothing is reused first: keeping it free longer saves no work.
                if block_to_key[block] is None:
                    empty.append(block)
                else:
                    cached[block] = None

    def touch(self, blocks: list[int]) -> None:
        """Take a reference to prefix-cache hits; a hit on a free block takes it off the list."""
        ref_counts, cached = self.ref_counts, self._cached
        for block in blocks:
            if ref_counts[block] == 0:
                del cached[block]  # a free block found by its key is always in the LRU list
            ref_counts[block] += 1

    def allocation_order(self) -> list[int]:
        """Every free block in the order allocate() would hand them out (tests, debugging)."""
        fresh = range(self._next_fresh, self.num_blocks)
        below_cap = max(0, self.resident_cap + 1 - self._next_fresh)
        return [
            *reversed(self._empty),
            *fresh[:below_cap],
            *self._cached,
            *fresh[below_cap:],
        ]

    def find_cached_prefix(self, keys: list[BlockKey], max_blocks: int) -> list[int]:
        """The blocks holding the longest cached prefix among the first max_blocks keys.

        Takes keys, not token ids: a request keys its blocks once (Request.extend_block_keys)
        so a request waiting at the head of the queue does not rehash its prompt every step.
        """
        if not self.enable_caching:
            return []
        hits = []
        key_to_block = self.key_to_block
        for key in keys[:max_blocks]:
            block = key_to_block.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_free_among(self, blocks: list[int]) -> int:
        """How many of these blocks sit in the free list (touching them shrinks it)."""
        ref_counts = self.ref_counts
        return sum(1 for block in blocks if ref_counts[block] == 0)

    def record_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.num_query_tokens += num_tokens
        self.num_hit_tokens += num_hit_tokens

    def cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the request's full blocks inside its first num_tokens positions.

        The caller passes positions that are computed (or launched: steps run in order on the
        device) and known; a block holding a placeholder is never registered, so the cache
        only ever promises KV for token ids the host has seen.
        """
        if not self.enable_caching:
            return
        bs = self.block_size
        num_blocks = min(num_tokens, request.num_known_tokens, len(request.block_ids) * bs) // bs
        first = request.num_registered_blocks
        if num_blocks <= first:
            return
        request.extend_block_keys(num_blocks * bs, bs)
        keys, block_ids = request.block_keys, request.block_ids
        key_to_block, block_to_key = self.key_to_block, self.block_to_key
        for i in range(first, num_blocks):
            key = keys[i]
            block = block_ids[i]
            # First writer wins: a second copy of the same prefix stays unregistered, so
            # key_to_block and block_to_key stay a bijection. A null entry was freed as
            # outside a sliding window (scheduler/sliding_window.py): nothing to offer.
            if block != NULL_BLOCK and key not in key_to_block and block_to_key[block] is None:
                key_to_block[key] = block
                block_to_key[block] = key
        request.num_registered_blocks = num_blocks

    def reset_counters(self) -> None:
        self.num_query_tokens = self.num_hit_tokens = 0

    def check(self) -> None:
        """Invariants, for tests: raise AssertionError naming the first one broken."""
        ref_counts, empty, cached = self.ref_counts, self._empty, self._cached
        free = self.allocation_order()
        assert ref_counts[NULL_BLOCK] == 0 and NULL_BLOCK not in free, "null block in use"
        assert self.block_to_key[NULL_BLOCK] is None, "null block cached"
        assert all(c >= 0 for c in ref_counts), "negative reference count"
        assert len(set(free)) == len(free), "a block on two free lists"
        used = sum(1 for c in ref_counts if c > 0)
        assert used + len(free) == self.num_blocks - 1, "free + used != total"
        for block in free:
            assert ref_counts[block] == 0, f"block {block} free with references"
        for block in empty:
            assert self.block_to_key[block] is None, f"block {block} on the empty list with a key"
        for block in cached:
            assert self.block_to_key[block] is not None, f"block {block} cached without a key"
        assert 1 <= self._next_fresh <= self.num_blocks, "resident set out of range"
        for block in range(self._next_fresh, self.num_blocks):
            assert self.block_to_key[block] is None, f"never-written block {block} has a key"
        assert self.num_resident_blocks <= max(self.resident_cap, self._peak_used), (
            "resident set past the cap while cached or empty blocks were free"
        )
        for key, block in self.key_to_block.items():
            assert self.block_to_key[block] == key, f"block {block}: key maps disagree"
        num_keyed = sum(1 for key in self.block_to_key if key is not None)
        assert num_keyed == len(self.key_to_block), "block_to_key holds stale keys"
        assert self.num_hit_tokens <= self.num_query_tokens, "more hits than queries"
