"""qkv_rope (split + q/k norm + rotary + cache write in one kernel) vs the float64 references."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from vtllm.kernels.cuda.attention import qkv_rope
from vtllm.kernels.reference import rms_norm_ref, rotary_ref, write_kv_ref
from vtllm.models.synthetic import to_bf16_bits

pytestmark = pytest.mark.cudasim

CASES = [(4, 2, 16, True), (2, 2, 8, False)] + ([] if SIMULATOR else [(32, 8, 128, True)])


def bf16_values(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
@pytest.mark.parametrize("hq,hk,d,norm", CASES)
def test_matches_reference(rng, hq, hk, d, norm, kv):
    T, bs, num_blocks, max_pos = 5, 4, 6, 64
    qkv = rng.standard_normal((T, (hq + 2 * hk) * d)).astype(np.float32)
    positions = np.array([0, 7, 3, 63, 9], np.int32)
    slots = np.array([0, 5, -1, 23, 9], np.int32)  # -1: padding, nothing written
    cos_sin = rng.uniform(-1, 1, (max_pos, d)).astype(np.float32)
    qn = rng.uniform(0.5, 1.5, d).astype(np.float32) if norm else None
    kn = rng.uniform(0.5, 1.5, d).astype(np.float32) if norm else None
    kc = rng.standard_normal((num_blocks, bs, hk, d)).astype(np.float32)
    vc = rng.standard_normal((num_blocks, bs, hk, d)).astype(np.float32)
    if kv == "bfloat16":  # the cache holds bf16 bits; the reference their values
        kc, vc = bf16_values(to_bf16_bits(kc)), bf16_values(to_bf16_bits(vc))
        k_dev, v_dev = dev(to_bf16_bits(kc)), dev(to_bf16_bits(vc))
    else:
        k_dev, v_dev = dev(kc), dev(vc)
    q = poisoned((T, hq, d))
    norms = {"q_norm": dev(qn), "k_norm": dev(kn)} if norm else {}
    qkv_rope(dev(qkv), q, k_dev, v_dev, dev(slots), dev(positions), dev(cos_sin), 1e-6, **norms)
    rq = qkv[:, : hq * d].reshape(T, hq, d).astype(np.float64)
    rk = qkv[:, hq * d : (hq + hk) * d].reshape(T, hk, d).astype(np.float64)
    rv = qkv[:, (hq + hk) * d :].reshape(T, hk, d)
    if norm:
        rq, rk = rms_norm_ref(rq, qn, 1e-6), rms_norm_ref(rk, kn, 1e-6)
    rq, rk = rotary_ref(rq, rk, positions, cos_sin)
    ref_kc, ref_vc = write_kv_ref(rk, rv, kc, vc, slots)
    np.testing.assert_allclose(host(q), rq, rtol=1e-5, atol=1e-5)
    if kv == "bfloat16":  # k rounded once from float32 (within half a bf16 step); v exactly
        np.testing.assert_allclose(bf16_values(host(k_dev)), ref_kc, rtol=2**-8, atol=1e-5)
        np.testing.assert_array_equal(host(v_dev), to_bf16_bits(ref_vc))
    else:
        np.testing.assert_allclose(host(k_dev), ref_kc, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(host(v_dev), ref_vc)
