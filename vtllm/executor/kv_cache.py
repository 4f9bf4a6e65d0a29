"""KV cache sizing and allocation: a byte budget, or a fraction of the memory that is free."""

import logging
import mmap
import os

import numpy as np

from vtllm.errors import InvalidParameter
from vtllm.models.config import ModelConfig
from vtllm.models.ops import KVCache

log = logging.getLogger("vtllm.kv")


def bytes_per_block(config: ModelConfig, block_size: int, itemsize: int = 4) -> int:
    return 2 * config.num_layers * block_size * config.kv_size * itemsize


def free_host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def num_kv_blocks(
    config: ModelConfig,
    *,
    block_size: int,
    budget_bytes: int,
    fraction: float,
    free_bytes: int,
    itemsize: int = 4,
) -> int:
    """Blocks that fit the budget (or `fraction` of free memory when the budget is 0), at
    itemsize bytes a value."""
    budget = budget_bytes or int(free_bytes * fraction)
    per_block = bytes_per_block(config, block_size, itemsize)
    blocks = budget // per_block
    if blocks < 2:
        raise InvalidParameter(
            f"KV cache budget of {budget} bytes holds fewer than 2 blocks of {block_size} tokens "
            f"({per_block} bytes each)",
            param="kv_cache_memory",
        )
    return int(blocks)


def resident_kv_blocks(
    config: ModelConfig, *, block_size: int, budget_bytes: int, max_model_len: int
) -> int:
    """Blocks the CPU KV cache may commit before cached prefixes are evicted for room.

    The cache is committed page by page as it is written (_lazy_zeros), so this bounds the RSS
    that the prefix cache keeps; requests that need more still get the whole budget. Default
    (budget_bytes 0): the bytes llama.cpp's server commits at start for the same context: f16 K
    and V for max_model_len tokens (half as many of our float32 tokens), one cache its slots
    share (llama-server runs 4 slots over one unified cache unless told otherwise). 90 MiB on
    the default model and context, so a long-lived server stays in the range a llama.cpp user
    expects."""
    per_token_f16 = bytes_per_block(config, 1, itemsize=2)
    budget = budget_bytes or max_model_len * per_token_f16
    return max(1, budget // bytes_per_block(config, block_size))


def _lazy_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """float32 zeros whose memory is committed page by page as it is first written, in 4 KiB
    pages. np.zeros asks for transparent huge pages on large arrays, and then the first token
    written into each layer's K and V commits 2 MiB apiece: 120 MiB of RSS for one short
    request on the default model (30 layers), against the ~50 KiB per token it uses."""
    count = int(np.prod(shape))
    buf = mmap.mmap(-1, max(count, 1) * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # also where THP is "always" rather than "madvise"
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, np.float32, count).reshape(shape)  # the array keeps buf alive


def allocate_kv_cache(config: ModelConfig, num_blocks: int, block_size: int) -> KVCache:
    shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
    kv = KVCache(_lazy_zeros(shape), _lazy_zeros(shape))
    log.info(
        "KV cache: %d blocks x %d tokens = %d tokens, %.1f MiB",
        num_blocks,
        block_size,
        num_blocks * block_size,
        (kv.k.nbytes + kv.v.nbytes) / (1 << 20),
    )
    return kv
