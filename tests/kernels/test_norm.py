"""rms_norm vs the reference (plain, fused residual, in place, q/k-norm view) and the bitwise
batch-invariance law."""

import numpy as np
import pytest

from vtllm.kernels.cpu.norm import rms_norm
from vtllm.kernels.reference import rms_norm_ref


def data(rng, t, h):
    x = (rng.standard_normal((t, h)) * rng.uniform(0.1, 10, (t, 1))).astype(np.float32)
    return (
        x,
        rng.uniform(0.5, 1.5, h).astype(np.float32),
        rng.standard_normal((t, h)).astype(np.float32),
    )


@pytest.mark.parametrize("h", [64, 576, 37])
def test_matches_reference(rng, h):
    x, w, res = data(rng, 9, h)
    out = np.empty_like(x)
    rms_norm(x, w, 1e-6, out)
    np.testing.assert_allclose(out, rms_norm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)
    res2 = res.copy()
    rms_norm(x, w, 1e-5, out, residual=res2)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-5, res)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-6)
    assert np.array_equal(res2, x + res)  # the residual add is one float32 add
    np.testing.assert_allclose(res2, ref_res, rtol=1e-6)


def test_in_place_and_head_view(rng):
    x, w, _ = data(rng, 6, 64)
    want = np.empty_like(x)
    rms_norm(x, w, 1e-6, want)
    y = x.copy()
    rms_norm(y, w, 1e-6, y)
    assert np.array_equal(y, want)
    q = x.reshape(3, 2, 64).copy()  # Qwen3 q-norm: [T, heads, D] viewed as [T*heads, D]
    q2 = q.reshape(-1, 64)
    rms_norm(q2, w, 1e-6, q2)
    assert np.array_equal(q.reshape(6, 64), want)


def test_batch_invariance(rng, threads):
    x, w, res = data(rng, 37, 100)
    full, full_res = np.empty_like(x), res.copy()
    with threads(2):
        rms_norm(x, w, 1e-6, full, residual=full_res)
    with threads(1):
        for t in (0, 5, 36):
            one, one_res = np.empty((1, 100), np.float32), res[t : t + 1].copy()
            rms_norm(x[t : t + 1], w, 1e-6, one, residual=one_res)
            assert np.array_equal(one[0], full[t]) and np.array_equal(one_res[0], full_res[t])
        other, _, _ = data(rng, 5, 100)
        mixed = np.concatenate([other[:2], x[7:8], other[2:]])
        out = np.empty_like(mixed)
        rms_norm(mixed, w, 1e-6, out, residual=np.concatenate([other[:2], res[7:8], other[2:]]))
        assert np.array_equal(out[2], full[7])


def test_bad_inputs(rng):
    x, w, res = data(rng, 4, 64)
    out = np.empty_like(x)
    for args, kw in [
        ((x.astype(np.float64), w, 1e-6, out), {}),
        ((x, w[:-1], 1e-6, out), {}),
        ((x, w, 1e-6, out[:, :32]), {}),
        ((x, w, 1e-6, np.empty((64, 4), np.float32).T), {}),
        ((x, w, 1e-6, out), {"residual": res[:2]}),
        ((x[:, ::2], w[:32], 1e-6, out[:, :32]), {}),
        ((x[0], w, 1e-6, out[0]), {}),
    ]:
        with pytest.raises(ValueError):
            rms_norm(*args, **kw)


def test_read_only_inputs(rng):
    x, w, _ = data(rng, 3, 64)
    want = np.empty_like(x)
    rms_norm(x, w, 1e-6, want)
    x.flags.writeable = w.flags.writeable = False
    out = np.empty_like(x)
    rms_norm(x, w, 1e-6, out)
    assert np.array_equal(out, want)
