"""linear_mma (bf16 W packed for the tensor cores, x split into two bf16) against the float64
reference; the same bits for a token whatever the batch around it; bad shapes refused.
Under the simulator the mma is a float64 stand-in (see kernels/cuda/_ptx.py), so there these
tests check the packing, the fragment indexing and the work split; on a GPU, the real mma."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned, random_weight
from vtllm.kernels import QType
from vtllm.kernels.cpu.quant import dequantize, quantize
from vtllm.kernels.cuda import rms_norm
from vtllm.kernels.cuda._linear_mma import (
    PREPACK_ABOVE,
    TOKENS,
    UNROLL,
    WARPS,
    WIDE_WARPS,
    linear_mma,
    pack_bf16,
    packed_shape,
    x_scratch_words,
)
from vtllm.kernels.cuda.activation import silu_and_mul, tile_interleave
from vtllm.kernels.reference import linear_ref

pytestmark = pytest.mark.cudasim

# (N, K): one tile; K tiles not a multiple of WARPS x 4 (padded tiles); several row tiles; a
# narrow W with a long K, which takes WIDE_WARPS warps per block (padded K too)
WIDE = (32, 16 * (WIDE_WARPS * UNROLL + 3))
SHAPES = [(16, 16), (32, 48 * WARPS), WIDE]
if not SIMULATOR:  # 8B down, 0.6B down (wide); 8B o, 0.6B qkv; a few rows with a long K
    SHAPES += [(4096, 14336), (1024, 3072), (4096, 4096), (4096, 1024), (160, 14336)]
MS = [1, 9] + ([] if SIMULATOR else [TOKENS, TOKENS + 3, 200])


def packed(w_bits):
    return pack_bf16(dev(w_bits))


def check_close(out, x, w_bits, bias=None):
    """x is carried as hi + lo bf16 (relative error <= 2^-15 per element), W exactly; plus
    float32 accumulation, relative to sum |x| |w|."""
    ref = linear_ref(x, w_bits, QType.BF16, bias)
    mag = np.abs(x.astype(np.float64)) @ np.abs(dequantize(w_bits, QType.BF16)).T.astype(np.float64)
    if bias is not None:
        mag += np.abs(bias)
    assert not np.isnan(out).any(), "unwritten outputs"
    bound = (2.0**-15 + 4e-7 * np.sqrt(x.shape[1])) * mag + 1e-6
    np.testing.assert_array_less(np.abs(out - ref), bound)


@pytest.mark.parametrize("m", MS)
def test_matches_reference(rng, m):
    for i, (n, k) in enumerate(SHAPES):
        w = random_weight(rng, QType.BF16, n, k)
        x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32) if i % 2 == 0 else None
        for scratch in (None, dev(np.full(x_scratch_words(m, k) + 5, 0xFFFFFFFF, np.uint32))):
            out = poisoned((m, n))
            b = None if bias is None else dev(bias)
            linear_mma(dev(x), packed(w), out, bias=b, x_scratch=scratch)
            check_close(host(out), x, w, bias)


def rounded_to_bf16(x):
    """x rounded to the nearest bf16 (ties to even), as float32."""
    return dequantize(quantize(x, QType.BF16), QType.BF16)


@pytest.mark.parametrize("m", MS[:1] if SIMULATOR else MS)  # m = 9: ~100 s in the simulator
def test_x_bf16_multiplies_x_rounded_to_bf16(rng, m):
    """W packed with x_bf16: one mma a product, on x rounded to bf16. That is exactly the
    hi + lo kernel on x rounded beforehand (lo is zero there, its mma adds zeros), in decode
    and split steps alike."""
    for i, (n, k) in enumerate(SHAPES):
        w_bits = random_weight(rng, QType.BF16, n, k)
        fast, plain = pack_bf16(dev(w_bits), x_bf16=True), packed(w_bits)
        x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
        x[0, :3] = 1.0 + 2.0**-9  # a tie: rounds to even (1.0), not up
        assert (rounded_to_bf16(x) != x).mean() > 0.9  # rounding matters on these inputs
        bias = dev(rng.standard_normal(n).astype(np.float32)) if i % 2 else None
        scratches = [None]
        if m > PREPACK_ABOVE:  # up to PREPACK_ABOVE tokens a scratch changes nothing
            scratches.append(dev(np.zeros(x_scratch_words(m, k), np.uint32)))
        for scratch in scratches:
            ours, theirs = poisoned((m, n)), poisoned((m, n))
            linear_mma(dev(x), fast, ours, bias=bias, x_scratch=scratch)
            linear_mma(dev(rounded_to_bf16(x)), plain, theirs, bias=bias, x_scratch=scratch)
            assert not np.isnan(host(ours)).any(), "unwritten outputs"
            np.testing.assert_array_equal(host(ours), host(theirs))  # values: -0 == +0


def test_packed_layout_is_the_mma_fragment_order(rng):
    """Lane L's registers of tile (0, 0): W[g, 2t..2t+1], W[g+8, ..], W[g, 2t+8..], W[g+8, ..]
    with g = L // 4, t = L % 4, the lower column in the low half."""
    w = rng.integers(0, 1 << 16, (16, 32), dtype=np.uint16)
    p = host(packed(w).data)
    assert p.shape == packed_shape(16, 32) and not p[0, 2 * 128 :].any(), "padding is zeros"
    for lane in range(32):
        g, t = lane // 4, lane % 4
        spots = [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]
        for reg, (r, c) in enumerate(spots):
            for kt in range(2):
                word = int(p[0, kt * 128 + 4 * lane + reg])
                assert word & 0xFFFF == w[r, 16 * kt + c]
                assert word >> 16 == w[r, 16 * kt + c + 1]


def test_narrow_long_matrices_take_wide_blocks(rng):
    assert pack_bf16(dev(random_weight(rng, QType.BF16, *WIDE))).slices == WIDE_WARPS
    assert pack_bf16(dev(random_weight(rng, QType.BF16, *SHAPES[1]))).slices == WARPS


# The wide-block shape on the card only (make test-gpu): about 3 minutes under the simulator,
# whose CI phase is near its limit; the simulator keeps the WARPS-slice blocks' case.
@pytest.mark.parametrize("shape", [SHAPES[1]] + ([] if SIMULATOR else [WIDE]))
def test_a_token_gets_the_same_bits_in_any_batch(rng, shape):
    """Decode of one token, a batch, and a prefill-sized step, x split in the kernel or
    beforehand into the scratch: the row of a token is bitwise the same (the depth-2 law
    needs it)."""
    n, k = shape
    w = packed(random_weight(rng, QType.BF16, n, k))
    x = (rng.standard_normal((2 * TOKENS + 5, k))).astype(np.float32)
    scratch = dev(np.zeros(x_scratch_words(*x.shape), np.uint32))
    full = poisoned(x.shape[0:1] + (n,))
    linear_mma(dev(x), w, full, x_scratch=scratch)
    full = host(full)
    subsets = ([0], [TOKENS + 2], list(range(3, 3 + PREPACK_ABOVE + 1)), [2 * TOKENS + 4, 5])
    for rows in subsets:
        for use_scratch in (False, True):
            sub = poisoned((len(rows), n))
            linear_mma(dev(x[rows]), w, sub, x_scratch=scratch if use_scratch else None)
            np.testing.assert_array_equal(host(sub), full[rows])


@pytest.mark.parametrize("m", [1, 5, 12])
@pytest.mark.parametrize("with_bias", [False, True])
def test_swiglu_epilogue_gives_the_bits_of_the_separate_activation(rng, m, with_bias):
    """A gate/up matrix with its rows interleaved in runs of 8: linear_mma(swiglu=True) writes
    silu(gate) * up with the bits of the product followed by silu_and_mul(tile=8), bias
    included, in decode steps and in steps of several token groups."""
    n, k = 64, 48 * WARPS
    w = tile_interleave(random_weight(rng, QType.BF16, n, k), 8)
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    bias = dev(rng.standard_normal(n).astype(np.float32)) if with_bias else None
    product, act, fused = poisoned((m, n)), poisoned((m, n // 2)), poisoned((m, n // 2))
    linear_mma(dev(x), packed(w), product, bias=bias)
    silu_and_mul(product, act, tile=8)
    linear_mma(dev(x), packed(w), fused, bias=bias, swiglu=True)
    assert not np.isnan(host(fused)).any(), "unwritten outputs"
    np.testing.assert_array_equal(host(fused), host(act))
    with pytest.raises(ValueError, match="do not fit"):  # out must be [M, N / 2]
        linear_mma(dev(x), packed(w), poisoned((m, n)), swiglu=True)


def host_bits(w, n, k):
    """The bf16 bits of packed W, unpacked from fragment order (inverse of pack_bf16)."""
    p = host(w.data)
    bits = np.zeros((n, k), np.uint16)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        spots = [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]
        for reg, (r, c) in enumerate(spots):
            for kt in range(k // 16):
                word = p[:, kt * 128 + 4 * lane + reg]
                for nt in range(n // 16):
                    bits[16 * nt + r, 16 * kt + c] = word[nt] & 0xFFFF
                    bits[16 * nt + r, 16 * kt + c + 1] = word[nt] >> 16
    return bits


def test_bad_shapes_are_refused(rng):
    w = random_weight(rng, QType.BF16, 16, 16)
    with pytest.raises(ValueError, match="multiples of 16"):
        pack_bf16(dev(np.zeros((16, 20), np.uint16)))
    out = dev(np.zeros((2, 16), np.float32))
    for k in (20, 32):
        with pytest.raises(ValueError, match="do not fit"):
            linear_mma(dev(np.zeros((2, k), np.float32)), packed(w), out)
    with pytest.raises(ValueError, match="do not fit"):
        linear_mma(
            dev(np.zeros((2, 16), np.float32)), packed(w), dev(np.zeros((3, 16), np.float32))
        )


# (N, K, M): one chunk of rms_norm's and one to eight tokens, K over several chunks (the
# simulator's chunk is 128 columns), the wide kernel (its threads past rms_norm's add zeros)
FOLDS = [(64, 48 * WARPS, 1), (64, 48 * WARPS, PREPACK_ABOVE), (32, 160, 3), WIDE + (1,)]
if not SIMULATOR:  # Qwen3-0.6B qkv and gate_up, 8B qkv, a K over two chunks of 4,096
    FOLDS += [(4096, 1024, 1), (6144, 1024, 8), (6144, 4096, 2), (64, 4352, 5)]


@pytest.mark.parametrize(("n", "k", "m"), FOLDS, ids=str)
def test_folded_norm_gives_the_bits_of_rms_norm_first(rng, n, k, m):
    """norm_weight: the product of rms_norm(x) with the bits of rms_norm followed by the
    linear (bias, and on narrow W the SwiGLU epilogue, included); x itself is left alone."""
    w = packed(tile_interleave(random_weight(rng, QType.BF16, n, k), 8))
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    nw = dev(rng.uniform(0.5, 1.5, k).astype(np.float32))
    bias = dev(rng.standard_normal(n).astype(np.float32))
    x_dev, normed = dev(x), poisoned((m, k))
    rms_norm(x_dev, nw, 1e-6, normed)
    for swiglu in (False, True) if w.slices == WARPS else (False,):
        width = n // 2 if swiglu else n
        ours, theirs = poisoned((m, width)), poisoned((m, width))
        linear_mma(normed, w, theirs, bias=bias, swiglu=swiglu)
        linear_mma(x_dev, w, ours, bias=bias, swiglu=swiglu, norm_weight=nw, eps=1e-6)
        assert not np.isnan(host(ours)).any(), "unwritten outputs"
        np.testing.assert_array_equal(host(ours), host(theirs))
    np.testing.assert_array_equal(host(x_dev), x)


@pytest.mark.parametrize("m", [1, PREPACK_ABOVE])
def test_accumulate_gives_the_bits_of_the_residual_add(rng, m):
    """accumulate: out += the product, the residual stream rms_norm(h, residual=) would
    update with h = the product (bias included)."""
    n, k = 64, 48 * WARPS
    w = packed(random_weight(rng, QType.BF16, n, k))
    x = dev((rng.standard_normal((m, k)) * 3).astype(np.float32))
    res = rng.standard_normal((m, n)).astype(np.float32)
    bias = dev(rng.standard_normal(n).astype(np.float32))
    h, theirs, ours = poisoned((m, n)), dev(res), dev(res)
    linear_mma(x, w, h, bias=bias)
    rms_norm(h, dev(np.ones(n, np.float32)), 1e-6, poisoned((m, n)), residual=theirs)
    linear_mma(x, w, ours, bias=bias, accumulate=True)
    np.testing.assert_array_equal(host(ours), host(theirs))


def test_folds_refuse_bad_arguments(rng):
    n, k = 32, 48 * WARPS
    w = packed(random_weight(rng, QType.BF16, n, k))
    x, nw = dev(np.ones((2, k), np.float32)), dev(np.ones(k, np.float32))
    with pytest.raises(ValueError, match="norm_weight"):
        linear_mma(x, w, poisoned((2, n)), norm_weight=dev(np.ones(k - 1, np.float32)))
    big = dev(np.ones((PREPACK_ABOVE + 1, k), np.float32))
    with pytest.raises(ValueError, match="at most"):
        linear_mma(big, w, poisoned((PREPACK_ABOVE + 1, n)), norm_weight=nw)
    with pytest.raises(ValueError, match="at most"):
        linear_mma(big, w, poisoned((PREPACK_ABOVE + 1, n)), accumulate=True)
    with pytest.raises(ValueError, match="together"):
        linear_mma(x, w, poisoned((2, n)), norm_weight=nw, accumulate=True)
    with pytest.raises(ValueError, match="together"):
        linear_mma(x, w, poisoned((2, n // 2)), swiglu=True, accumulate=True)
