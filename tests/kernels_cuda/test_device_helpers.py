"""Device helpers bit for bit: the sampler's counter-based uniform against the CPU's, and the
f16 / bf16 decoders against numpy on all 65536 patterns (subnormals, infinities, NaN payloads)."""

import numpy as np
import pytest
from numba import cuda

from tests.kernels_cuda.helpers import dev, host, poisoned
from vtllm.kernels.cuda._device import bf16_to_f32, f16_to_f32, uniform
from vtllm.kernels.sampling_reference import uniform as uniform_ref

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


def test_uniform_matches_cpu_bits(rng):
    seeds = np.concatenate([rng.integers(0, 2**63, 40, dtype=np.uint64) * np.uint64(2),
                            np.array([0, 2**64 - 1], np.uint64)])  # fmt: skip
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
