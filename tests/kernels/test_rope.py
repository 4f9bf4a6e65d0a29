"""rotary vs the reference, the cos/sin table vs HF transformers' inverse frequencies, and the
bitwise batch-invariance law."""

import numpy as np
import pytest

from vtllm.kernels.cpu.rope import rope_cos_sin, rope_inv_freq, rotary
from vtllm.kernels.reference import rotary_ref

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# inv_freq[i] from transformers 5.24 (ROPE_INIT_FUNCTIONS) for head_dim 128, theta 500000.
HF_DEFAULT = {0: 1.0, 20: 0.016560440883040428, 40: 0.00027424818836152554}
HF_LLAMA3 = {
    0: 1.0,
    28: 0.0032114461064338684,
    29: 0.0021665706299245358,
    31: 0.0008567514596506953,
    34: 0.0001785077911335975,
    35: 9.556212171446532e-05,
    63: 3.068925877869333e-07,
}


def test_inv_freq_matches_transformers():
    linear = {"rope_type": "linear", "factor": 4.0}
    for table, scaling, div in [
        (HF_DEFAULT, None, 1),
        (HF_LLAMA3, LLAMA3, 1),
        (HF_DEFAULT, linear, 4),
    ]:
        got = rope_inv_freq(128, 500000.0, scaling)
        for i, want in table.items():
            assert got[i] == pytest.approx(want / div, rel=1e-6), (scaling, i)
    with pytest.raises(ValueError):
        rope_inv_freq(128, 1e4, {"rope_type": "yarn", "factor": 2.0})


def test_cos_sin_table():
    cs = rope_cos_sin(300, 64, 10000.0)
    assert cs.dtype == np.float32 and cs.shape == (300, 64)
    assert np.array_equal(cs[0], np.r_[np.ones(32), np.zeros(32)].astype(np.float32))
    ang = 257 * 10000.0 ** (-np.arange(0, 64, 2) / 64)
    np.testing.assert_allclose(cs[257], np.r_[np.cos(ang), np.sin(ang)], atol=6e-8)
    short = LLAMA3 | {"original_max_position_embeddings": 64}
    assert not np.array_equal(rope_cos_sin(300, 64, 1e4, scaling=short), cs)


@pytest.mark.parametrize("d", [64, 128, 6])
def test_matches_reference(rng, d):
    cs = rope_cos_sin(4096, d, 10000.0)
    q = rng.standard_normal((11, 9, d)).astype(np.float32)
    k = rng.standard_normal((11, 3, d)).astype(np.float32)
    pos = rng.integers(0, 4096, 11).astype(np.int32)
    q_ref, k_ref = rotary_ref(q, k, pos, cs)
    rotary(q, k, pos, cs)
    np.testing.assert_allclose(q, q_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(k, k_ref, rtol=1e-5, atol=1e-6)


def test_batch_invariance(rng, threads):
    cs = rope_cos_sin(512, 64, 10000.0)
    q = rng.standard_normal((37, 9, 64)).astype(np.float32)
    k = rng.standard_normal((37, 3, 64)).astype(np.float32)
    pos = rng.integers(0, 512, 37).astype(np.int32)
    fq, fk = q.copy(), k.copy()
    with threads(2):
        rotary(fq, fk, pos, cs)
    with threads(1):
        for t in (0, 20, 36):
            oq, ok = q[t : t + 1].copy(), k[t : t + 1].copy()
            rotary(oq, ok, pos[t : t + 1], cs)
            assert np.array_equal(oq[0], fq[t]) and np.array_equal(ok[0], fk[t])


def test_bad_inputs(rng):
    cs = rope_cos_sin(16, 8, 10000.0)
    q = rng.standard_normal((2, 2, 8)).astype(np.float32)
    k = rng.standard_normal((2, 1, 8)).astype(np.float32)
    pos = np.array([0, 15], np.int32)
    q0 = q.copy()
    for args in [
        (q, k, np.array([0, 16], np.int32), cs),
        (q, k, np.array([-1, 0], np.int32), cs),
        (q, k, pos.astype(np.int64), cs),
        (q, k[:1], pos, cs),
        (q.astype(np.float64), k, pos, cs),
        (q[:, :, :4], k[:, :, :4], pos, cs),
        (q, k, pos, cs.astype(np.float64)),
        (q.reshape(2, 16), k, pos, cs),
    ]:
        with pytest.raises(ValueError):
            rotary(*args)
    assert np.array_equal(q, q0)  # bad positions are rejected before anything is rotated
    with pytest.raises(ValueError):
        rope_cos_sin(16, 7, 10000.0)


def test_read_only_table(rng):
    cs = rope_cos_sin(16, 8, 10000.0)
    pos = np.array([3, 9], np.int32)
    cs.flags.writeable = pos.flags.writeable = False
    q, k = rng.standard_normal((2, 2, 8)).astype(np.float32), np.ones((2, 1, 8), np.float32)
    q_ref, _ = rotary_ref(q, k, pos, cs)
    rotary(q, k, pos, cs)
    np.testing.assert_allclose(q, q_ref, rtol=1e-5, atol=1e-6)
