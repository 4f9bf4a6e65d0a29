"""The paged KV cache on the GPU: its storage types and the write of new keys and values.

Caches are [num_blocks, block_size, Hk, D] per layer, float32 or bf16 bits (uint16, values
rounded to nearest even): KV_DTYPES names them for the executor. How kernels read and write an
item of either type is _kv_cache's (kv_value, kv_store, ...). The forward writes its keys inside
the attention kernels (attention.qkv_attention); write_kv is the op on its own.
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR
from vtllm.kernels.cuda._host import check
from vtllm.kernels.cuda._kv_cache import KV_DTYPES, check_kv, kv_store
from vtllm.kernels.cuda._ptx import grid_dependency_sync

__all__ = ["KV_DTYPES", "write_kv"]

WRITE_THREADS = 32 if SIMULATOR else 128


@cuda.jit(cache=True)
def _write_kv_kernel(k, v, k_cache, v_cache, slot_mapping):
    grid_dependency_sync()
    t = cuda.blockIdx.x
    slot = slot_mapping[t]
    bs = k_cache.shape[1]
    if slot < 0 or slot >= k_cache.shape[0] * bs:
        return
    blk, off = slot // bs, slot % bs
    hk, d = k.shape[1], k.shape[2]
    for j in range(cuda.threadIdx.x, hk * d, cuda.blockDim.x):
        h, c = j // d, j % d
        kv_store(k_cache, blk, off, h, c, k[t, h, c])
        kv_store(v_cache, blk, off, h, c, v[t, h, c])


def write_kv(k, v, k_cache, v_cache, slot_mapping, *, stream=0) -> None:
    """k_cache/v_cache [num_blocks, block_size, Hk, D] at slot_mapping[t] (= block * block_size
    + offset; -1 skips the row, as does any slot outside the cache) <- k[t], v[t] ([T, Hk, D]).
    The caches are float32 or bf16 bits (uint16; values rounded to nearest even)."""
    check("write_kv", "k", k, np.float32, 3)
    check("write_kv", "v", v, np.float32, 3, k.shape)
    check_kv("write_kv", k_cache, v_cache)
    check("write_kv", "slot_mapping", slot_mapping, np.int32, 1, k.shape[:1])
    if tuple(k.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(f"write_kv: k {k.shape} does not fit k_cache {k_cache.shape}")
    if k.shape[0] == 0:
        return
    _write_kv_kernel[k.shape[0], WRITE_THREADS, stream](k, v, k_cache, v_cache, slot_mapping)
