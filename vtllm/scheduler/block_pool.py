"""KV-cache blocks: reference counts, an LRU free list and the prefix cache of full blocks.

Block 0 is the null block: never allocated or freed, so the executor can point padded
block-table entries (and the KV writes of padded tokens) at it without harming anyone.

Hot path: allocate/free/touch are O(blocks involved). Keep it lean; put features in helpers.
"""

from collections import OrderedDict

from vtllm.scheduler.request import Request

NULL_BLOCK = 0

BlockKey = tuple[int, tuple[int, ...]]  # (parent hash, token ids of the block)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True):
        self.num_blocks = num_blocks  # the null block included
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref_counts = [0] * num_blocks
        # Free blocks in eviction order: allocation takes the head. A freed block that holds a
        # cached prefix goes to the tail (least recently used evicted first); a block holding
        # nothing goes to the head, since keeping it free longer saves no work.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
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
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - 1 - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.key_to_block)

    def allocate(self, n: int) -> list[int]:
        """Take n blocks from the head of the free list, evicting their cached prefixes."""
        if n > len(self._free):
            raise RuntimeError(f"allocate({n}) with {len(self._free)} free blocks")
        blocks = []
        popitem, ref_counts, block_to_key = self._free.popitem, self.ref_counts, self.block_to_key
        for _ in range(n):
            block, _ = popitem(last=False)
            key = block_to_key[block]
            if key is not None:
                del self.key_to_block[key]
                block_to_key[block] = None
            ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block; in reverse so a sequence's tail is evicted first."""
        ref_counts, free, block_to_key = self.ref_counts, self._free, self.block_to_key
        for block in reversed(blocks):
            count = ref_counts[block] - 1
            if count < 0 or block == NULL_BLOCK:
                raise RuntimeError(f"double free of block {block}")
            ref_counts[block] = count
            if count == 0:
                free[block] = None
                if block_to_key[block] is None:
                    free.move_to_end(block, last=False)

    def touch(self, blocks: list[int]) -> None:
        """Take a reference to prefix-cache hits; a hit on a free block takes it off the list."""
        ref_counts, free = self.ref_counts, self._free
        for block in blocks:
            if ref_counts[block] == 0:
                del free[block]
            ref_counts[block] += 1

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
            # key_to_block and block_to_key stay a bijection.
            if key not in key_to_block and block_to_key[block] is None:
                key_to_block[key] = block
                block_to_key[block] = key
        request.num_registered_blocks = num_blocks

    def reset_counters(self) -> None:
        self.num_query_tokens = self.num_hit_tokens = 0

    def check(self) -> None:
        """Invariants, for tests: raise AssertionError naming the first one broken."""
        ref_counts, free = self.ref_counts, self._free
        assert ref_counts[NULL_BLOCK] == 0 and NULL_BLOCK not in free, "null block in use"
        assert self.block_to_key[NULL_BLOCK] is None, "null block cached"
        assert all(c >= 0 for c in ref_counts), "negative reference count"
        used = sum(1 for c in ref_counts if c > 0)
        assert used + len(free) == self.num_blocks - 1, "free + used != total"
        for block in free:
            assert ref_counts[block] == 0, f"block {block} free with references"
        for key, block in self.key_to_block.items():
            assert self.block_to_key[block] == key, f"block {block}: key maps disagree"
        num_keyed = sum(1 for key in self.block_to_key if key is not None)
        assert num_keyed == len(self.key_to_block), "block_to_key holds stale keys"
        assert self.num_hit_tokens <= self.num_query_tokens, "more hits than queries"
