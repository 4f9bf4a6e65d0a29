"""Device helpers bit for bit: the sampler's counter-based uniform against the CPU's, the
f16 / bf16 decoders against numpy on all 65536 patterns (subnormals, infinities, NaN payloads),
and the KV cache's copies into shared memory (float32 and bf16 caches) with a lane exchange."""

import numpy as np
import pytest
from numba import cuda, uint32

from tests.kernels_cuda.helpers import dev, host, poisoned
from vtllm.kernels.cuda._device import bf16_to_f32, f16_to_f32, lane_value, sync_warp, uniform
from vtllm.kernels.cuda._kv_cache import kv_copy4_async, kv_shared4, kv_words4
from vtllm.kernels.cuda._ptx import copy_async_commit, copy_async_waiter
from vtllm.kernels.sampling_reference import uniform as uniform_ref
from vtllm.models.synthetic import to_bf16_bits

pytestmark = pytest.mark.cudasim


@cuda.jit
def _uniform_kernel(seeds, positions, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = uniform(seeds[i], positions[i])


@cuda.jit
def _halves_kernel(bits, out_f16, out_bf16):
    for i in range(cuda.grid(1), bits.shape[0], cuda.gridsize(1)):
        out_f16[i] = f16_to_f32(bits[i])
        out_bf16[i] = bf16_to_f32(bits[i])


_WAIT_ALL = copy_async_waiter(0)


@cuda.jit
def _kv_ring_kernel(cache, at, out, traded):
    """Lane l copies cache items at[l] .. + 3 to shared words l * kv_words4 (odd lanes: a
    copy that is not live), reads them back as float32, and trades at[] with lane 7 l % 32."""
    ws = cuda.shared.array(128, uint32)
    lane = cuda.threadIdx.x
    i = lane * kv_words4(cache)
    kv_copy4_async(cache, at[lane], ws, i, lane % 2 == 0)
    copy_async_commit()
    _WAIT_ALL()
    sync_warp()
    out[lane, 0], out[lane, 1], out[lane, 2], out[lane, 3] = kv_shared4(cache, ws, i)
    traded[lane] = lane_value(at[lane], 7 * lane % 32)


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
def test_kv_copies_into_shared_memory_read_back_as_stored(rng, kv):
    cache = rng.standard_normal((3, 4, 2, 16)).astype(np.float32)
    if kv == "bfloat16":
        cache = to_bf16_bits(cache)
    at = (rng.permutation(cache.size // 4)[:32] * 4).astype(np.int32)
    out, traded = poisoned((32, 4)), poisoned(32, np.int32)
    _kv_ring_kernel[1, 32](dev(cache), dev(at), out, traded)
    values = cache.ravel()
    if kv == "bfloat16":
        values = (values.astype(np.uint32) << 16).view(np.float32)
    want = values[at[:, None] + np.arange(4)]
    want[1::2] = 0.0  # copies that are not live fill zeros
    np.testing.assert_array_equal(host(out), want)
    np.testing.assert_array_equal(host(traded), at[7 * np.arange(32) % 32])


def test_uniform_matches_cpu_bits(rng):
    seeds = np.concatenate(
        [
            rng.integers(0, 2**63, 40, dtype=np.uint64) * np.uint64(2),
            np.array([0, 2**64 - 1], np.uint64),
        ]
    )
    positions = rng.integers(0, 1 << 20, seeds.size).astype(np.int32)
    out = poisoned(seeds.size, np.float64)
    _uniform_kernel[2, 32](dev(seeds), dev(positions), out)
    want = [uniform_ref(int(s), int(p)) for s, p in zip(seeds, positions, strict=True)]
    np.testing.assert_array_equal(host(out), np.array(want))


def test_half_decoders_match_numpy_on_every_pattern():
    bits = np.arange(1 << 16, dtype=np.uint16)
    out16, outbf = poisoned(bits.size), poisoned(bits.size)
    _halves_kernel[4, 32](dev(bits), out16, outbf)
    want = bits.view(np.float16).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(host(out16).view(np.uint32), want)
    np.testing.assert_array_equal(host(outbf).view(np.uint32), bits.astype(np.uint32) << 16)
