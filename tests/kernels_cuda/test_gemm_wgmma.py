"""gemm_wgmma (warpgroup tensor cores) against linear_mma, bit for bit, and the float64
reference; round_x against split_x's hi; bad inputs refused. Under the simulator the tiles are
small (one warpgroup, 16 tokens), so the shapes below still cover partial blocks in both
directions, K tiles not a multiple of the residue count, more K tiles than a stage and padded
K. On a GPU without wgmma (not sm_90) the module says so and the tests skip."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned, random_weight
from tests.kernels_cuda.test_linear_mma import check_close, rounded_to_bf16
from vtllm.kernels import QType
from vtllm.kernels.cuda._gemm_wgmma import (
    BLOCK_TILES,
    STAGE_TILES,
    STAGES,
    TOKENS,
    WGMMA,
    gemm_wgmma,
    round_x,
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

pytestmark = [
    pytest.mark.cudasim,
    pytest.mark.skipif(not WGMMA, reason="wgmma needs an sm_90 (Hopper) GPU"),
]

ROWS = 16 * BLOCK_TILES  # one block's rows of W
# (N, K): a single tile (fewer K tiles than residues); a partial row block, K tiles not a
# multiple of the residues; more K tiles than the stages hold at once (one past them: the
# refills wrap around the ring of stage slots); on the GPU a narrow W with a long K
# (WIDE_WARPS residues in linear_mma) and the 8B shapes
SHAPES = [(16, 16), (ROWS + 16, 16 * (RESIDUES + 1))]
SHAPES += [(ROWS, 16 * (STAGES * STAGE_TILES + 1))]
if not SIMULATOR:  # (the simulator runs a block's 128 threads in Python: minutes a shape)
    SHAPES += [(32, 16 * (WIDE_WARPS * UNROLL + 3))]
    SHAPES += [(4096, 4096), (160, 14336), (6144 + 16, 4096 + 48)]
# a partial block past a whole one (and on the GPU one token, exactly one block, more)
MS = [TOKENS + 9] + ([] if SIMULATOR else [1, TOKENS, 3 * TOKENS + 1, 1000])


def run_both(x, w, bias):
    """(gemm_wgmma's out, linear_mma's out) for x (host) and w packed with x_bf16."""
    m, k = x.shape
    scratch = dev(np.full(x_scratch_words(m, k) + 5, 0xFFFFFFFF, np.uint32))
    b = None if bias is None else dev(bias)
    xd = dev(x)
    ours, theirs = poisoned((m, w.n)), poisoned((m, w.n))
    gemm_wgmma(round_x(xd, scratch), w, ours, bias=b)
    linear_mma(xd, w, theirs, bias=b, x_scratch=scratch)
    return host(ours), host(theirs)


@pytest.mark.parametrize("m", MS)
def test_same_bits_as_linear_mma(rng, m):
    for i, (n, k) in enumerate(SHAPES):
        w_bits = random_weight(rng, QType.BF16, n, k)
        w = pack_bf16(dev(w_bits), x_bf16=True)
        x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
        if m > 1:  # zero products, signed zeros (one token's row: not the only one)
            x[m // 2, : k // 2] = 0.0
            x[m // 2, k // 2 :] = -0.0
        bias = rng.standard_normal(n).astype(np.float32) if (i + m) % 2 else None
        ours, theirs = run_both(x, w, bias)
        assert not np.isnan(ours).any(), f"unwritten outputs, shape {i}"
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
        check_close(ours, rounded_to_bf16(x), w_bits, bias)


def test_device_weight_takes_wgmma_where_asked(rng, monkeypatch):
    """matmul: a W uploaded with wgmma sends the steps gemm_pays for to gemm_wgmma, with the
    bits of the same W's gemm_mma route (and a gate/up W's silu(gate) * up after it). The
    simulator counts every step a GEMM's (its thresholds would need minutes a call)."""
    from vtllm.kernels.cuda import matmul as cuda_model
    from vtllm.kernels.cuda._gemm_mma import BLOCK_GROUPS, GEMM_ABOVE, GEMM_MIN_BLOCKS
    from vtllm.kernels.cuda.matmul import DeviceWeight

    n, k = ROWS, 32
    if SIMULATOR:
        m = TOKENS + 9
        monkeypatch.setattr(cuda_model, "gemm_pays", lambda m, n: True)
    else:
        m = GEMM_ABOVE + 8 * BLOCK_GROUPS * GEMM_MIN_BLOCKS
    assert cuda_model.gemm_pays(m, n)
    launched, launch = [], cuda_model.gemm_wgmma
    monkeypatch.setattr(
        cuda_model, "gemm_wgmma", lambda *a, **kw: (launched.append(1), launch(*a, **kw))
    )
    w_bits = random_weight(rng, QType.BF16, n, k)
    packed = pack_bf16(dev(w_bits), x_bf16=True)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = dev(rng.standard_normal(n).astype(np.float32))
    scratch = dev(np.zeros(x_scratch_words(m, k), np.uint32))
    outs = []
    for wgmma in (True, False):
        out, act = poisoned((m, n)), poisoned((m, n // 2))
        dw = DeviceWeight(packed, int(QType.BF16), packed=True, wgmma=wgmma)
        dw.matmul(dev(x), out, bias=bias, x_scratch=scratch)
        dw.matmul(dev(x), poisoned((m, n)), x_scratch=scratch, act=act)
        outs.append((host(out), host(act)))
    assert len(launched) == 2  # both calls of the wgmma W, none of the other's
    for ours, theirs in zip(*outs, strict=True):
        assert not np.isnan(ours).any()
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_round_x_is_split_x_hi(rng):
    """round_x's words are split_x's hi halves (x_bf16), laid out row-major."""
    m, k = 11, 48
    x = (rng.standard_normal((m, k)) * 5).astype(np.float32)
    x[2, 3], x[4, 5] = -0.0, np.float32(1.0 + 2.0**-8)  # a signed zero, a tie to even
    scratch = dev(np.zeros(x_scratch_words(m, k), np.uint32))
    xw = host(round_x(dev(x), scratch)).copy()
    xp = host(split_x(dev(x), dev(np.zeros(x_scratch_words(m, k), np.uint32)), x_bf16=True))
    # split_x: group j, tile kt, lane 4 g + t holds tokens 8 j + g, k = 16 kt + 2 t (+ 8)
    for tok in range(m):
        for kt in range(k // 16):
            for t in range(4):
                lane = 4 * (tok % 8) + t
                h0, h1 = xp[tok // 8, 64 * kt + 2 * lane], xp[tok // 8, 64 * kt + 2 * lane + 1]
                assert xw[tok, 8 * kt + t] == h0 and xw[tok, 8 * kt + 4 + t] == h1


def test_bad_inputs_are_refused(rng):
    w_bits = dev(random_weight(rng, QType.BF16, 16, 32))
    w = pack_bf16(w_bits, x_bf16=True)
    xw = dev(np.zeros((3, 16), np.uint32))
    with pytest.raises(ValueError, match="x_bf16"):
        gemm_wgmma(xw, pack_bf16(w_bits), dev(np.zeros((3, 16), np.float32)))
    with pytest.raises(ValueError, match="does not fit"):
        gemm_wgmma(xw, w, dev(np.zeros((3, 32), np.float32)))
    with pytest.raises(ValueError, match="xw must have shape"):
        gemm_wgmma(xw, w, dev(np.zeros((4, 16), np.float32)))
    with pytest.raises(ValueError, match="bias"):
        gemm_wgmma(xw, w, dev(np.zeros((3, 16), np.float32)), bias=dev(np.zeros(8, np.float32)))
    with pytest.raises(ValueError, match="multiple of 16"):
        round_x(dev(np.zeros((2, 24), np.float32)), dev(np.zeros(64, np.uint32)))
