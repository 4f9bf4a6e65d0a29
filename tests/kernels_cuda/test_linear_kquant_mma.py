"""K-quant W (Q2_K .. Q6_K) on the tensor cores (_kquant_pack): the packed codes and scale records
decode to the CPU's weights bit for bit; every route (linear_mma for decode steps, M = 1
included, linear_rows for batched ones, gemm_mma for prefill) against the float64 reference
of the decoded weights, and a row's bits the same on every route and at every step size; the
fused epilogues (norm folded in, accumulate, swiglu) give the plain route's bits; a MixedRows
qkv of Q4_K and Q6_K parts writes each part's columns with the bits the part gives alone. Random
valid blocks (every code, subnormal and negative scales). The smallest shapes that take every
route: under the simulator every thread runs in Python."""

import numpy as np
import pytest
from numba import cuda

from tests.kernels.kquant_blocks import random_kquant
from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned
from vtllm.kernels import QType
from vtllm.kernels.cpu.quant import dequantize
from vtllm.kernels.cuda import rms_norm
from vtllm.kernels.cuda._gemm_mma import gemm_mma
from vtllm.kernels.cuda._kquant_pack import packed_bytes_per_weight, record_words, tile_words
from vtllm.kernels.cuda._linear_mma import linear_mma, split_x, x_scratch_words
from vtllm.kernels.cuda._linear_rows import linear_rows
from vtllm.kernels.cuda.activation import silu_and_mul
from vtllm.kernels.cuda.matmul import DeviceWeight, upload_kquant, upload_matrix, upload_mixed

pytestmark = pytest.mark.cudasim

KQ = [QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K]
N, K = 16, 256  # one row tile, one super-block
M = 9  # two token groups: the batched routes' smallest real case
if not SIMULATOR:  # K padded to whole rounds of the loop (768: 48 tiles of 64), two row tiles
    N, K, M = 272, 768, 200
_OFFSET = {QType.Q3_K: 4, QType.Q6_K: 32}  # u - o: the signed codes


def decode_packed(w, qtype):
    """(S, U, Mn) [N, K] from the packed codes and records, read back as the _kquant_pack
    docstring lays them out: the weight is S * U - Mn (U signed for Q3_K and Q6_K)."""
    n, k, kq = w.n, w.k, int(qtype)
    nts, kts, sbs = n // 16, k // 16, k // 256
    tiles = host(w.data).reshape(nts, -1, tile_words(kq))[:, :kts]
    U = np.zeros((n, k), np.int64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r in range(4):
            for h in range(2):
                if tile_words(kq) == 32:
                    code = (tiles[:, :, lane] >> (4 * r + 16 * h)) & 15
                else:
                    code = (tiles[:, :, 2 * lane + r // 2] >> (8 * (2 * (r % 2) + h))) & 255
                rows = 16 * np.arange(nts)[:, None] + g + 8 * (r & 1)
                cols = 16 * np.arange(kts)[None, :] + 2 * t + 8 * (r >> 1) + h
                U[rows, cols] = code
    U -= _OFFSET.get(qtype, 0)
    rec = host(w.scale).reshape(nts, -1, record_words(kq))[:, :sbs]  # [row tile, super-block]
    mins = qtype in (QType.Q2_K, QType.Q4_K, QType.Q5_K)
    wide = qtype in (QType.Q4_K, QType.Q5_K)  # 32-weight sub-blocks
    S, Mn = np.zeros((n, k), np.float32), np.zeros((n, k), np.float32)
    for i in range(16):  # row i of each row tile: lane group g, half (rows g + 8)
        g, half = i % 8, i // 8
        rows = 16 * np.arange(nts) + i
        d = rec[:, :, (4 if mins else 2) * g + half].view(np.float32)
        dmin = rec[:, :, 4 * g + 2 + half].view(np.float32) if mins else np.zeros_like(d)
        width = 32 if wide else 16
        for s in range(256 // width):
            e = rec[:, :, (32 if mins else 16) + 8 * (s if wide else s // 2) + g].astype(np.int64)
            if wide:
                sc, m = (e >> (8 * half)) & 255, (e >> (16 + 8 * half)) & 255
            else:
                b = (e >> (16 * (s % 2) + 8 * half)) & 255
                sc, m = (b & 15, b >> 4) if qtype == QType.Q2_K else ((b ^ 128) - 128, 0 * b)
            for sb in range(sbs):
                cols = slice(sb * 256 + s * width, sb * 256 + (s + 1) * width)
                S[rows, cols] = (d[:, sb] * sc[:, sb].astype(np.float32))[:, None]
                Mn[rows, cols] = (dmin[:, sb] * m[:, sb].astype(np.float32))[:, None]
    return S, U, Mn


def check_close(out, x, S, U, Mn, bias=None):
    """x goes in as hi + lo bf16 (relative error <= 2^-15 a value), the codes exactly; each
    tile's S * sum(u x) - M * sum(x) in float32, relative to sum |x| (|S u| + |M|)."""
    w = S.astype(np.float64) * U - Mn
    ref = x.astype(np.float64) @ w.T + (0 if bias is None else bias)
    mag = np.abs(x.astype(np.float64)) @ (np.abs(S.astype(np.float64) * U) + np.abs(Mn)).T
    mag += 0 if bias is None else np.abs(bias)
    assert not np.isnan(out).any(), "unwritten outputs"
    bound = (2.0**-15 + 4e-7 * np.sqrt(x.shape[1])) * mag + 1e-6
    np.testing.assert_array_less(np.abs(out - ref), bound)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def kquant_weight(rng, qtype, n=N, k=K, x_bf16=False):
    rows = random_kquant(rng, qtype, n, k)
    return rows, upload_kquant(rows, qtype, (n, k), x_bf16=x_bf16, stream=cuda.stream())


def run_linear_mma(x, w, bias=None, **kwargs):
    out = poisoned((x.shape[0], w.n))
    linear_mma(dev(x), w, out, bias=None if bias is None else dev(bias), **kwargs)
    return host(out)


def split(x, x_bf16=False):
    scratch = dev(np.zeros(x_scratch_words(*x.shape), np.uint32))
    return split_x(dev(x), scratch, x_bf16=x_bf16)


def activations(rng, m=M, k=K):
    return (rng.standard_normal((m, k)) * 3).astype(np.float32)


@pytest.mark.smoke
@pytest.mark.parametrize("qtype", KQ, ids=lambda q: q.name)
def test_packed_weights_decode_to_the_cpus(rng, qtype):
    """S * (u - o) - M from the packed words, in float32 as the CPU rounds it: dequantize's
    weights, bit for bit (codes, scale bytes and d / dmin all in their places)."""
    rows, w = kquant_weight(rng, qtype, 16, 512 if not SIMULATOR else 256)
    S, U, Mn = decode_packed(w, qtype)
    got = (S * U.astype(np.float32) - Mn).astype(np.float32)
    assert np.array_equal(bits(got), bits(dequantize(rows, qtype)))
    assert packed_bytes_per_weight(int(qtype)) < 1.1


def rounded(x, x_bf16):
    """x as the mmas see it with x_bf16 (rounded to bf16, nearest even), else as given."""
    if not x_bf16:
        return x
    u = x.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).view(np.float32)


# Q4_K: 4-bit codes with minimums, x split into hi + lo; Q6_K: byte codes, signed, x_bf16
@pytest.mark.parametrize("qtype, x_bf16", [(QType.Q4_K, False), (QType.Q6_K, True)], ids=str)
def test_every_route_gives_a_row_the_same_bits(rng, qtype, x_bf16):
    rows, w = kquant_weight(rng, qtype, x_bf16=x_bf16)
    S, U, Mn = decode_packed(w, qtype)
    x = activations(rng)
    bias = rng.standard_normal(N).astype(np.float32)
    full = run_linear_mma(x, w, bias)
    check_close(full, rounded(x, x_bf16), S, U, Mn, bias)
    # a decode step: a row alone (M = 1)
    assert np.array_equal(bits(run_linear_mma(x[4:5], w, bias)), bits(full[4:5]))
    if not SIMULATOR:  # and in a small batch, elsewhere in it
        assert np.array_equal(bits(run_linear_mma(x[4:7], w, bias)), bits(full[4:7]))
    for route in (linear_rows, gemm_mma):  # batched decode, prefill
        out = poisoned((M, N))
        route(split(x, x_bf16), w, out, bias=dev(bias))
        assert np.array_equal(bits(host(out)), bits(full)), route.__name__


@pytest.mark.parametrize("qtype", [QType.Q2_K, QType.Q3_K, QType.Q5_K], ids=lambda q: q.name)
def test_other_types_decode_and_prefill_alike(rng, qtype):
    """The other types' conversions and scales (x_bf16 W: one mma a product): the one-token
    route against the reference; on a card, the prefill route's bits too."""
    rows, w = kquant_weight(rng, qtype, x_bf16=True)
    S, U, Mn = decode_packed(w, qtype)
    x = activations(rng, 1 if SIMULATOR else M)
    one = run_linear_mma(x, w)
    check_close(one, rounded(x, True), S, U, Mn)
    if not SIMULATOR:
        out = poisoned(one.shape)
        gemm_mma(split(x, True), w, out)
        assert np.array_equal(bits(host(out)), bits(one))


def test_fused_epilogues_give_the_plain_routes_bits(rng):
    _, w = kquant_weight(rng, QType.Q4_K, x_bf16=True)
    x = activations(rng, 1)
    plain = run_linear_mma(x, w)
    residual = rng.standard_normal((1, N)).astype(np.float32)
    acc = dev(residual)
    linear_mma(dev(x), w, acc, accumulate=True)
    assert np.array_equal(bits(host(acc)), bits(residual + plain))
    nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
    normed = dev(np.zeros_like(x))
    rms_norm(dev(x), dev(nw), 1e-5, normed)
    want = run_linear_mma(host(normed), w)
    got = run_linear_mma(x, w, norm_weight=dev(nw), eps=1e-5)
    assert np.array_equal(bits(got), bits(want))


def test_swiglu_epilogue_gives_silu_and_mul_bits(rng):
    """A Q4_K gate/up matrix uploaded by upload_matrix (rows interleaved in runs of 8, their
    scales with them): the decode epilogue against silu_and_mul over the plain product."""
    n = 2 * N
    rows = random_kquant(rng, QType.Q4_K, n, K, hi=-3.5)  # products silu takes without overflow
    weight = upload_matrix(
        rows, QType.Q4_K, (n, K), gate_up=True, x_bf16=True, kquant=True, stream=cuda.stream()
    )
    assert weight.packed and weight.data.kq == QType.Q4_K and not weight.data.fp8
    x = activations(rng, 1)
    product = poisoned((1, n))
    linear_mma(dev(x), weight.data, product)
    want = poisoned((1, n // 2))
    silu_and_mul(product, want, tile=8)
    got = poisoned((1, n // 2))
    linear_mma(dev(x), weight.data, got, swiglu=True)
    assert np.array_equal(bits(host(got)), bits(host(want)))


def test_mixed_qkv_parts_write_their_columns_with_their_own_bits(rng):
    """q in Q4_K and v in Q6_K (Q4_K_M's mix) as one MixedRows: each part's columns of the
    one buffer carry the bits of the part alone, plain and with the norm folded in."""
    parts = [random_kquant(rng, QType.Q4_K, N, K), random_kquant(rng, QType.Q6_K, N, K)]
    types = [QType.Q4_K, QType.Q6_K]
    pairs = list(zip(parts, types, strict=True))
    mixed = upload_mixed(pairs, x_bf16=True, kquant=True, stream=cuda.stream())
    assert mixed.packed and all(p.packed for p in mixed.parts)
    x = activations(rng, 1)
    bias = rng.standard_normal(2 * N).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
    out, folded = poisoned((1, 2 * N)), poisoned((1, 2 * N))
    if not SIMULATOR:  # (the folded step below writes through the same column views)
        mixed.matmul(dev(x), out, bias=dev(bias))
    mixed.matmul_folded(dev(x), folded, bias=dev(bias), norm_weight=dev(nw), eps=1e-5)
    normed = dev(np.zeros_like(x))
    rms_norm(dev(x), dev(nw), 1e-5, normed)
    for i, part in enumerate(mixed.parts):
        cols = slice(i * N, (i + 1) * N)
        if not SIMULATOR:
            alone = run_linear_mma(x, part.data, bias[cols])
            assert np.array_equal(bits(host(out)[:, cols]), bits(alone))
        alone = run_linear_mma(host(normed), part.data, bias[cols])
        assert np.array_equal(bits(host(folded)[:, cols]), bits(alone))


def test_unpackable_shapes_keep_the_gemv():
    rng = np.random.default_rng(3)
    rows = random_kquant(rng, QType.Q4_K, 24, 256)  # N not a multiple of 16
    weight = upload_matrix(rows, QType.Q4_K, (24, 256), kquant=True, stream=cuda.stream())
    assert not weight.packed and isinstance(weight, DeviceWeight)
    assert np.array_equal(host(weight.data), rows)
    rows = random_kquant(rng, QType.Q4_K, 32, 256)  # packs, but only when asked to
    weight = upload_matrix(rows, QType.Q4_K, (32, 256), stream=cuda.stream())
    assert not weight.packed and np.array_equal(host(weight.data), rows)
