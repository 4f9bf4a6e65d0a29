"""Sliding-window KV: the blocks of a sequence that no query still to come can read.

When every attention layer sees only its last `window` keys (the query's own included), a query
at position q reads positions q - window + 1 .. q and nothing before. The scheduler gives a
block back to the pool once every position in it is older than the window of every query that
may still run: those of the steps in flight (the executor may still be computing them) and
those not planned yet, which all come later. A chunk's rows look back a window each, so its
FIRST row bounds what it reads. The freed block-table entries become the null block: the table
keeps its positions, and attention starts each row at its window's first key (both backends'
windowed kernels: kernels/cpu/attention_window.py, kernels/cuda/_attention_paged.py), so it
never reads them. Only a prefix of the table is ever freed: `Request.num_released_blocks`.

Only models whose EVERY layer is windowed free anything (Mistral, Phi-3 with a window shorter
than max_model_len). Gemma 2 and Gemma 3 mix windowed and global layers over one block table,
and a global layer reads every key, so with one table per sequence nothing of theirs can be
freed; keeping a separate table per layer group (vLLM's hybrid allocator) would.

Prefix caching: a freed block keeps its cache key and stays valid until the pool hands it out
again (which drops the key), as every freed cached block does, so a hit never maps to KV that
was overwritten. A request reusing a cached prefix needs only the blocks inside its first
query's window, so the lookup (find_window_hit) takes the longest hit whose window blocks are
all cached, however many older blocks were evicted, and seats null entries below them.
"""

from collections import deque

from vtllm.scheduler.block_pool import NULL_BLOCK, BlockKey, BlockPool
from vtllm.scheduler.request import Request


def window_of_every_layer(
    sliding_window: int, sliding_layers: tuple[bool, ...], max_model_len: int
) -> int:
    """The window whose outside blocks may be freed, or 0 (keep every block).

    sliding_layers must say every layer is windowed: Gemma's global layers (a False among
    them) read every key. A window no shorter than max_model_len never binds (the forward runs
    plain attention then: models/llama.py)."""
    if 0 < sliding_window < max_model_len and sliding_layers and all(sliding_layers):
        return sliding_window
    return 0


def peak_blocks(num_positions: int, block_size: int, window: int, max_chunk: int) -> int:
    """The most blocks a request whose KV covers num_positions positions holds at once.

    Without a window, all of them. With one, a step holds the blocks from the window of the
    oldest chunk in flight to the end of the chunk being planned: at most window - 1 older
    positions, plus that chunk and one more in flight (depth 2), each up to max_chunk tokens,
    and one block more when the span straddles block boundaries."""
    full = -(-num_positions // block_size)
    if not window:
        return full
    span = window - 1 + 2 * min(max_chunk, num_positions)
    return min(full, -(-span // block_size) + 1)


def first_query_to_come(req: Request, oldest_step_in_flight: int) -> int:
    """The first position a query of the request may still run at: the start of its oldest
    chunk in flight, else where its next chunk starts.

    req.chunks_in_flight holds (step id, start) of its planned chunks, oldest first; those of
    steps older than oldest_step_in_flight were collected and are dropped here. Starts only
    grow while a request holds its blocks (preemption clears the list), and a speculative
    roll back returns to the position after its chunk's first row at the earliest, so the
    oldest entry is the smallest."""
    planned = req.chunks_in_flight
    while planned and planned[0][0] < oldest_step_in_flight:
        planned.popleft()
    return planned[0][1] if planned else req.num_computed_tokens


def release_outside_window(req: Request, pool: BlockPool, end: int) -> None:
    """Free the request's blocks [num_released_blocks, end): no query still to come reads
    them (the caller checked: end * block_size <= first_query_to_come - window + 1)."""
    done = req.num_released_blocks
    # offer the full blocks to the prefix cache first: once null, an entry is never registered
    pool.cache_full_blocks(req, end * pool.block_size)
    blocks = req.block_ids
    # free() takes a list from its end, and cached blocks are evicted in the order they were
    # freed: reversed, the oldest block is evicted first. A prefix hit needs the blocks at the
    # end of its prefix (find_window_hit), never the ones before them.
    pool.free(blocks[done:end][::-1])
    blocks[done:end] = [NULL_BLOCK] * (end - done)
    req.num_released_blocks = end


def find_window_hit(
    pool: BlockPool, keys: list[BlockKey], max_blocks: int, window: int
) -> tuple[list[int], int]:
    """(block table of a prefix hit, number of null entries leading it): the longest hit of
    m <= max_blocks blocks whose blocks inside the window of position m * block_size (the
    first query to compute) are all cached; blocks before that window may have been evicted.

    Walks back from the longest candidate: a miss at block j rules out every hit that needs j,
    so the next candidate ends at j."""
    if not pool.enable_caching:
        return [], 0
    key_to_block, bs = pool.key_to_block, pool.block_size
    m = min(max_blocks, len(keys))
    while m > 0:
        lo = max(0, m * bs - window + 1) // bs  # first block the window of position m*bs reads
        j = m - 1
        while j >= lo and keys[j] in key_to_block:
            j -= 1
        if j < lo:
            return [NULL_BLOCK] * lo + [key_to_block[keys[i]] for i in range(lo, m)], lo
        m = j
    return [], 0


def forget_window_state(req: Request) -> None:
    """The request gave its blocks up (preempted or finished): no null entries, no chunks."""
    req.num_released_blocks = 0
    req.chunks_in_flight = deque()


def live_blocks(blocks: list[int]) -> list[int]:
    """The table's entries that hold a reference (freed window entries are the null block)."""
    return [b for b in blocks if b != NULL_BLOCK]
