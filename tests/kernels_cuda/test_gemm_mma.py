"""gemm_mma (operands shared through shared memory) against linear_mma, bit for bit, and the
float64 reference; DeviceWeight.matmul's switch to it; bad shapes refused. Under the simulator
the tiles are small (BLOCK_TILES x BLOCK_GROUPS of gemm_mma), so the shapes below still cover
partial blocks in both directions, K tiles not a multiple of the residue count and padded K."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned, random_weight
from tests.kernels_cuda.test_linear_mma import check_close, rounded_to_bf16
from vtllm.kernels import QType
from vtllm.kernels.cuda._gemm_mma import (
    BLOCK_GROUPS,
    BLOCK_TILES,
    GEMM_ABOVE,
    GEMM_MIN_BLOCKS,
    gemm_mma,
    gemm_pays,
)
from vtllm.kernels.cuda._linear_mma import (
    UNROLL,
    WIDE_WARPS,
    linear_mma,
    pack_bf16,
    split_x,
    x_scratch_words,
)
from vtllm.kernels.cuda._linear_mma import WARPS as RESIDUES
from vtllm.kernels.cuda.matmul import DeviceWeight

pytestmark = pytest.mark.cudasim

ROWS, TOKENS = 16 * BLOCK_TILES, 8 * BLOCK_GROUPS  # one block's output tile
# (N, K): a single tile (fewer K tiles than residues); a partial row block with K tiles not a
# multiple of the residues; whole row blocks with K padded in W's packing; a narrow W with a
# long K (WIDE_WARPS residues in linear_mma)
SHAPES = [(16, 16), (ROWS + 16, 16 * (RESIDUES + 1)), (2 * ROWS, 16 * (3 * RESIDUES + 2))]
SHAPES += [(32, 16 * (WIDE_WARPS * UNROLL + 3))]
if not SIMULATOR:
    SHAPES += [(4096, 4096), (160, 14336), (6144 + 16, 4096 + 48)]
# one token (a partial group); exactly one token tile; a partial tile and group past one
MS = [1, TOKENS, TOKENS + 9] + ([] if SIMULATOR else [3 * TOKENS + 1, 1000])


def run_both(x, w, bias):
    """(gemm_mma's out, linear_mma's out) for x (host) and packed w, on the same split of x."""
    m, k = x.shape
    scratch = dev(np.full(x_scratch_words(m, k) + 5, 0xFFFFFFFF, np.uint32))
    b = None if bias is None else dev(bias)
    xd = dev(x)
    ours, theirs = poisoned((m, w.n)), poisoned((m, w.n))
    gemm_mma(split_x(xd, scratch, x_bf16=w.x_bf16), w, ours, bias=b)
    linear_mma(xd, w, theirs, bias=b, x_scratch=scratch)
    return host(ours), host(theirs)


# Under the simulator (slow) the partial tile past one (TOKENS + 9) with x rounded to bf16
# only, the GPU default; the card runs every M both ways.
CASES = [(m, x_bf16) for m in MS for x_bf16 in (False, True)]
if SIMULATOR:
    CASES.remove((TOKENS + 9, False))


@pytest.mark.parametrize(("m", "x_bf16"), CASES)
def test_same_bits_as_linear_mma(rng, m, x_bf16):
    """Either way of carrying x (W packed with or without x_bf16)."""
    for i, (n, k) in enumerate(SHAPES):
        w_bits = random_weight(rng, QType.BF16, n, k)
        w = pack_bf16(dev(w_bits), x_bf16=x_bf16)
        x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
        if m > 1:  # zero products, signed zeros (one token's row: not the only one)
            x[m // 2, : k // 2] = 0.0
            x[m // 2, k // 2 :] = -0.0
        bias = rng.standard_normal(n).astype(np.float32) if (i + m) % 2 else None
        ours, theirs = run_both(x, w, bias)
        assert not np.isnan(ours).any(), f"unwritten outputs, shape {i}"
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
        check_close(ours, rounded_to_bf16(x) if x_bf16 else x, w_bits, bias)


@pytest.mark.parametrize("x_bf16", [False, True])
def test_device_weight_switches_where_gemm_pays(rng, x_bf16):
    """matmul: linear_mma for steps gemm_pays refuses, gemm_mma for the others; the same bits
    either way, so a token's row does not depend on which kernel its step ran."""
    n, k = SHAPES[0]
    m = GEMM_ABOVE + 8 * BLOCK_GROUPS * GEMM_MIN_BLOCKS  # enough block tiles at any n
    assert gemm_pays(m, n) and not gemm_pays(GEMM_ABOVE - 1, n)
    w_bits = random_weight(rng, QType.BF16, n, k)
    dw = DeviceWeight(pack_bf16(dev(w_bits), x_bf16=x_bf16), int(QType.BF16), packed=True)
    x = rng.standard_normal((m, k)).astype(np.float32)
    scratch = dev(np.zeros(x_scratch_words(*x.shape), np.uint32))
    full = poisoned((m, n))
    dw.matmul(dev(x), full, x_scratch=scratch)
    rows = [3, 0, m - 1]
    part = poisoned((len(rows), n))
    dw.matmul(dev(x[rows]), part, x_scratch=scratch)
    np.testing.assert_array_equal(host(part), host(full)[rows])
    check_close(host(full), rounded_to_bf16(x) if x_bf16 else x, w_bits)


def test_bad_shapes_are_refused(rng):
    w = pack_bf16(dev(random_weight(rng, QType.BF16, 16, 32)))
    xp = dev(np.zeros((1, 8 * 32), np.uint32))
    with pytest.raises(ValueError, match="does not fit"):
        gemm_mma(xp, w, dev(np.zeros((3, 32), np.float32)))
    with pytest.raises(ValueError, match="xp must have shape"):
        gemm_mma(xp, w, dev(np.zeros((9, 16), np.float32)))  # 9 tokens: two groups
    with pytest.raises(ValueError, match="bias"):
        gemm_mma(xp, w, dev(np.zeros((3, 16), np.float32)), bias=dev(np.zeros(8, np.float32)))
