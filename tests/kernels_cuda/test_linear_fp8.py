"""FP8 (e4m3) W packed by pack_fp8: every tensor-core route (linear_mma for decode steps,
linear_rows for batched ones, gemm_mma for prefill) against the float64 reference
e4m3(code) @ x * row scale (+ bias), and a row's bits the same on every route and at every step
size; the fused epilogues (norm folded in, accumulate, swiglu) give the plain route's bits; the
e4m3 -> bf16 conversion is exact for every code. The smallest shapes that take every route:
under the simulator every thread runs in Python."""

import numpy as np
import pytest
from numba import cuda

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from vtllm.kernels import FP8_ROWS, QType
from vtllm.kernels.cuda import rms_norm
from vtllm.kernels.cuda._fp8 import pack_fp8
from vtllm.kernels.cuda._gemm_mma import gemm_mma
from vtllm.kernels.cuda._linear_mma import linear_mma, split_x, x_scratch_words
from vtllm.kernels.cuda._linear_rows import linear_rows
from vtllm.kernels.cuda._ptx import e4m3x4_to_bf16x4
from vtllm.kernels.cuda.activation import silu_and_mul
from vtllm.kernels.cuda.matmul import upload_matrix
from vtllm.models.fp8 import E4M3

pytestmark = pytest.mark.cudasim

N, K = 32, 64  # two row tiles, four K tiles (padded to a whole round of the loop)
M = 9  # two token groups: the batched routes' smallest real case
if not SIMULATOR:
    N, K, M = 256, 1024, 200


def random_codes(rng, shape) -> np.ndarray:
    """Valid e4m3 codes, subnormals and zeros among them (never 0x7F / 0xFF, the NaNs)."""
    codes = rng.integers(0, 254, shape, dtype=np.uint8)
    return codes + (codes >= 0x7F).astype(np.uint8)


def fp8_weight(rng, n=N, k=K):
    codes = random_codes(rng, (n, k))
    scale = (rng.uniform(0.5, 2.0, n) / (64 * np.sqrt(k))).astype(np.float32)
    return codes, scale, pack_fp8(dev(codes), dev(scale))


def check_close(out, x, codes, scale, bias=None):
    """x goes in as hi + lo bf16 (relative error <= 2^-15 a value), W exactly; the sums in
    float32, relative to sum |x| |w|."""
    w = E4M3[codes].astype(np.float64) * scale[:, None]
    ref = x.astype(np.float64) @ w.T + (0 if bias is None else bias)
    mag = np.abs(x.astype(np.float64)) @ np.abs(w).T + (0 if bias is None else np.abs(bias))
    assert not np.isnan(out).any(), "unwritten outputs"
    bound = (2.0**-15 + 4e-7 * np.sqrt(x.shape[1])) * mag + 1e-6
    np.testing.assert_array_less(np.abs(out - ref), bound)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def run_linear_mma(x, w, bias=None, **kwargs):
    out = poisoned((x.shape[0], w.n))
    linear_mma(dev(x), w, out, bias=None if bias is None else dev(bias), **kwargs)
    return host(out)


def split(x):
    scratch = dev(np.zeros(x_scratch_words(*x.shape), np.uint32))
    return split_x(dev(x), scratch, x_bf16=False)


def test_every_route_gives_a_row_the_same_bits(rng):
    codes, scale, w = fp8_weight(rng)
    x = (rng.standard_normal((M, K)) * 3).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    full = run_linear_mma(x, w, bias)
    check_close(full, x, codes, scale, bias)
    # decode steps: the same rows alone (M = 1) and in a small batch (M = 3), elsewhere in it
    assert np.array_equal(bits(run_linear_mma(x[:1], w, bias)), bits(full[:1]))
    assert np.array_equal(bits(run_linear_mma(x[4:7], w, bias)), bits(full[4:7]))
    for route in (linear_rows, gemm_mma):  # batched decode, prefill
        out = poisoned((M, N))
        route(split(x), w, out, bias=dev(bias))
        assert np.array_equal(bits(host(out)), bits(full)), route.__name__


def test_fused_epilogues_give_the_plain_routes_bits(rng):
    codes, scale, w = fp8_weight(rng)
    x = (rng.standard_normal((1, K)) * 3).astype(np.float32)
    plain = run_linear_mma(x, w)
    # accumulate: residual + product, the add rms_norm(..., residual=) does
    residual = rng.standard_normal((1, N)).astype(np.float32)
    acc = dev(residual)
    linear_mma(dev(x), w, acc, accumulate=True)
    assert np.array_equal(bits(host(acc)), bits(residual + plain))
    # norm folded into the loads: the product of rms_norm's output
    nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
    normed = dev(np.zeros_like(x))
    rms_norm(dev(x), dev(nw), 1e-5, normed)
    want = run_linear_mma(host(normed), w)
    got = run_linear_mma(x, w, norm_weight=dev(nw), eps=1e-5)
    assert np.array_equal(bits(got), bits(want))


def test_swiglu_epilogue_gives_silu_and_mul_bits(rng):
    """A gate/up matrix uploaded as FP8_ROWS (rows interleaved in runs of 8 with their scales):
    the decode epilogue and the batched one against silu_and_mul over the plain product."""
    codes = random_codes(rng, (N, K))
    scale = (rng.uniform(0.5, 2.0, N) / (64 * np.sqrt(K))).astype(np.float32)
    rows = np.concatenate([codes, scale.astype("<f4").view(np.uint8).reshape(N, 4)], axis=1)
    weight = upload_matrix(rows, FP8_ROWS, (N, K), gate_up=True, stream=cuda.stream())
    assert weight.packed and weight.data.fp8 and weight.qtype == FP8_ROWS
    x = (rng.standard_normal((M, K)) * 3).astype(np.float32)
    product = poisoned((M, N))
    linear_mma(dev(x), weight.data, product)
    want = poisoned((M, N // 2))
    silu_and_mul(product, want, tile=8)
    got = poisoned((M, N // 2))
    linear_mma(dev(x[:1]), weight.data, got[:1], swiglu=True)
    linear_rows(split(x), weight.data, got, swiglu=True)
    assert np.array_equal(bits(host(got)), bits(host(want)))


@pytest.mark.smoke
def test_packed_layout_is_the_fragment_order():
    """Byte 2 r + h of lane L in tile (nt, kt): W[16 nt + g + 8 (r & 1), 16 kt + 2 t + 8 (r >> 1)
    + h] (g = L // 4, t = L % 4), pack_bf16's register order; tiles past K are zeros."""
    rng = np.random.default_rng(1)
    codes = random_codes(rng, (16, 32))
    packed = host(pack_fp8(dev(codes), dev(np.ones(16, np.float32))).data)
    tiles = packed.view(np.uint8).reshape(-1, 32, 8)  # [K tiles, lane, byte]
    for kt in range(2):
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for r in range(4):
                for h in range(2):
                    want = codes[g + 8 * (r & 1), 16 * kt + 2 * t + 8 * (r >> 1) + h]
                    assert tiles[kt, lane, 2 * r + h] == want
    assert not tiles[2:].any()


@cuda.jit
def _convert(words, out):
    i = cuda.grid(1)
    if i < words.shape[0]:
        out[2 * i], out[2 * i + 1] = e4m3x4_to_bf16x4(words[i])


@pytest.mark.smoke
def test_conversion_is_exact_for_every_code():
    codes = np.arange(256, dtype=np.uint8)
    out = dev(np.zeros(128, np.uint32))
    _convert[1, 64](dev(codes.view(np.uint32)), out)
    got = (host(out).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    valid = ~np.isnan(E4M3)
    assert valid.sum() == 254
    assert np.array_equal(bits(got[valid]), bits(E4M3[valid]))  # -0 stays -0, subnormals exact


def test_unpackable_shapes_go_up_as_float32():
    rng = np.random.default_rng(3)
    codes = random_codes(rng, (24, 40))
    scale = rng.uniform(0.5, 2.0, 24).astype(np.float32)
    rows = np.concatenate([codes, scale.view(np.uint8).reshape(24, 4)], axis=1)
    weight = upload_matrix(rows, FP8_ROWS, (24, 40), stream=cuda.stream())
    assert not weight.packed and weight.qtype == QType.F32
    assert np.array_equal(bits(host(weight.data)), bits(E4M3[codes] * scale[:, None]))
