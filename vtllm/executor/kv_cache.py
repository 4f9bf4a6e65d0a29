"""KV cache sizing and allocation: a byte budget, or a fraction of the memory that is free."""

import logging
import os

import numpy as np

from vtllm.errors import InvalidParameter
from vtllm.models.config import ModelConfig
from vtllm.models.llama import KVCache

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
    config: ModelConfig, *, block_size: int, budget_bytes: int, fraction: float, free_bytes: int
) -> int:
    """Blocks that fit the budget (or `fraction` of free memory when the budget is 0)."""
    budget = budget_bytes or int(free_bytes * fraction)
    blocks = budget // bytes_per_block(config, block_size)
    if blocks < 2:
        raise InvalidParameter(
            f"KV cache budget of {budget} bytes holds fewer than 2 blocks of {block_size} tokens "
            f"({bytes_per_block(config, block_size)} bytes each)",
            param="kv_cache_memory",
        )
    return int(blocks)


def allocate_kv_cache(config: ModelConfig, num_blocks: int, block_size: int) -> KVCache:
    shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
    kv = KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32))
    log.info(
        "KV cache: %d blocks x %d tokens = %d tokens, %.1f MiB",
        num_blocks,
        block_size,
        num_blocks * block_size,
        (kv.k.nbytes + kv.v.nbytes) / (1 << 20),
    )
    return kv
