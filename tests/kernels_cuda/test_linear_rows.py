"""linear_rows (several row tiles of W per block, batched decode) against linear_mma, bit for
bit, and the float64 reference; its SwiGLU epilogue; DeviceWeight.matmul's routing; bad inputs
refused. The shapes cover a partial last block of rows, partial token groups, K padded in W's
packing, fewer K tiles than slices, and a wide W (slices summed in several passes)."""

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR, dev, host, poisoned, random_weight
from tests.kernels_cuda.test_linear_mma import check_close, rounded_to_bf16
from vtllm.kernels import QType
from vtllm.kernels.cuda import _linear_rows as linear_rows_module
from vtllm.kernels.cuda import matmul as cuda_model
from vtllm.kernels.cuda._linear_mma import (
    UNROLL,
    WARPS,
    WIDE_WARPS,
    linear_mma,
    pack_bf16,
    split_x,
    x_scratch_words,
)
from vtllm.kernels.cuda._linear_rows import (
    MIN_BLOCKS,
    ROWS,
    TOKENS,
    WIDE_ROWS,
    linear_rows,
    row_tiles_for,
    rows_pay,
)
from vtllm.kernels.cuda.activation import silu_and_mul, tile_interleave
from vtllm.kernels.cuda.matmul import DeviceWeight

pytestmark = pytest.mark.cudasim

# (N, K): one row tile and fewer K tiles than slices; row tiles not a multiple of ROWS and K
# tiles not a multiple of the slices (padded K); several whole trips per warp; a wide W
# (WIDE_WARPS slices: several passes of the block's warps), K padded
SHAPES = [(16, 16), (16 * (2 * ROWS + 1), 16 * (WARPS + 3))]
SHAPES += [(16 * (ROWS + 1), 16 * 2 * WARPS * UNROLL), (16, 16 * (WIDE_WARPS * UNROLL + 5))]
if not SIMULATOR:
    SHAPES += [(6144, 4096), (1024 + 16, 1024 + 48)]
# one group and a partial one (the simulator's only case: it is slow); a partial group; one
# whole block; two blocks, the second one group and a token; several blocks
MS = [12] + ([] if SIMULATOR else [9, 32, 41, 64, 127])


def both(x, w, bias, rows):
    m, k = x.shape
    scratch = dev(np.full(x_scratch_words(m, k) + 5, 0xFFFFFFFF, np.uint32))
    b = None if bias is None else dev(bias)
    xd = dev(x)
    ours, theirs = poisoned((m, w.n)), poisoned((m, w.n))
    linear_rows(split_x(xd, scratch, x_bf16=w.x_bf16), w, ours, bias=b, rows=rows)
    linear_mma(xd, w, theirs, bias=b, x_scratch=scratch)
    return host(ours), host(theirs)


# Under the simulator (slow: ~60 s a combination) each value of x_bf16 and of rows once; the
# card runs all four.
COMBOS = [(False, ROWS), (True, WIDE_ROWS)]
if not SIMULATOR:
    COMBOS += [(True, ROWS), (False, WIDE_ROWS)]


@pytest.mark.parametrize(("x_bf16", "rows"), COMBOS)
@pytest.mark.parametrize("m", MS)
def test_same_bits_as_linear_mma(rng, m, x_bf16, rows):
    """Either way of carrying x (W packed with or without x_bf16), blocks of either number
    of row tiles."""
    for i, (n, k) in enumerate(SHAPES):
        w_bits = random_weight(rng, QType.BF16, n, k)
        w = pack_bf16(dev(w_bits), x_bf16=x_bf16)
        assert w.slices == (WIDE_WARPS if i == 3 else WARPS)
        x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
        x[m // 2, : k // 2] = 0.0  # zero products, signed zeros
        x[m // 2, k // 2 :] = -0.0
        bias = rng.standard_normal(n).astype(np.float32) if (i + m) % 2 else None
        ours, theirs = both(x, w, bias, rows)
        assert not np.isnan(ours).any(), f"unwritten outputs, shape {i}"
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
        check_close(ours, rounded_to_bf16(x) if x_bf16 else x, w_bits, bias)


@pytest.mark.parametrize(("x_bf16", "rows"), [(False, ROWS), (True, ROWS), (True, WIDE_ROWS)])
def test_swiglu_epilogue_gives_the_bits_of_the_separate_activation(rng, x_bf16, rows):
    """A gate/up matrix with its rows interleaved in runs of 8 (a partial last block of row
    tiles): linear_rows(swiglu=True) writes the bits of its product followed by
    silu_and_mul(tile=8), bias included."""
    n, k, m = 16 * (2 * WIDE_ROWS + 1), 16 * (WARPS + 3), 12
    w = pack_bf16(dev(tile_interleave(random_weight(rng, QType.BF16, n, k), 8)), x_bf16=x_bf16)
    x = dev((rng.standard_normal((m, k)) * 3).astype(np.float32))
    bias = dev(rng.standard_normal(n).astype(np.float32))
    xp = split_x(x, dev(np.zeros(x_scratch_words(m, k), np.uint32)), x_bf16=x_bf16)
    product, act, fused = poisoned((m, n)), poisoned((m, n // 2)), poisoned((m, n // 2))
    linear_rows(xp, w, product, bias=bias, rows=rows)
    silu_and_mul(product, act, tile=8)
    linear_rows(xp, w, fused, bias=bias, swiglu=True, rows=rows)
    assert not np.isnan(host(fused)).any(), "unwritten outputs"
    np.testing.assert_array_equal(host(fused).view(np.uint32), host(act).view(np.uint32))


def test_device_weight_takes_batched_steps_here(rng, monkeypatch):
    """matmul sends a batched-decode step that rows_pay for to linear_rows, and a token's row
    is the same bits as when it runs alone (linear_mma's one-group path)."""
    n, k = 16 * ROWS * MIN_BLOCKS, SHAPES[1][1]
    m = 12
    assert rows_pay(m, n) and not rows_pay(m, n - 16 * ROWS)
    calls = []

    def counted(*args, **kwargs):
        calls.append(m)
        linear_rows(*args, **kwargs)

    monkeypatch.setattr(cuda_model, "linear_rows", counted)
    w_bits = random_weight(rng, QType.BF16, n, k)
    dw = DeviceWeight(pack_bf16(dev(w_bits)), int(QType.BF16), packed=True)
    x = rng.standard_normal((m, k)).astype(np.float32)
    scratch = dev(np.zeros(x_scratch_words(m, k), np.uint32))
    full = poisoned((m, n))
    dw.matmul(dev(x), full, x_scratch=scratch)
    assert calls == [m]
    for t in (0, m - 1):
        alone = poisoned((1, n))
        dw.matmul(dev(x[t : t + 1]), alone, x_scratch=scratch)
        np.testing.assert_array_equal(host(alone)[0].view(np.uint32), host(full)[t].view(np.uint32))
    assert calls == [m]
    act, ref = poisoned((m, n // 2)), poisoned((m, n // 2))  # W as a gate/up matrix
    dw.matmul(dev(x), poisoned((m, n)), x_scratch=scratch, act=act)
    assert calls == [m, m]
    silu_and_mul(full, ref, tile=8)
    np.testing.assert_array_equal(host(act).view(np.uint32), host(ref).view(np.uint32))
    check_close(host(full), x, w_bits, None)


def test_blocks_take_more_row_tiles_only_where_the_grid_stays_full(monkeypatch):
    """WIDE_ROWS where blocks of that many row tiles still number WIDE_MIN_BLOCKS: with the
    GPU's threshold, the measured cases (BENCHMARKS.md) go the faster way."""
    monkeypatch.setattr(linear_rows_module, "WIDE_MIN_BLOCKS", 96)
    n = 16 * WIDE_ROWS * 96  # one token block of WIDE_ROWS row tiles: just enough
    assert row_tiles_for(TOKENS, n) == WIDE_ROWS
    assert row_tiles_for(TOKENS, n - 16 * WIDE_ROWS) == ROWS
    assert row_tiles_for(TOKENS + 1, n // 2) == WIDE_ROWS  # two token blocks
    assert row_tiles_for(184, 1024) == WIDE_ROWS  # 0.6B o: 96 blocks, 16.6 -> 15.4 us
    assert row_tiles_for(128, 1024) == ROWS  # 64 blocks: 11.3 vs 15.1 us
    assert row_tiles_for(16, 6144) == WIDE_ROWS  # 8B qkv: 96 blocks, 19.3 -> 18.8 us
    assert row_tiles_for(32, 4096) == ROWS  # 8B down: 64 blocks, 41.7 vs 55.7 us


def test_bad_inputs_are_refused(rng):
    w = pack_bf16(dev(random_weight(rng, QType.BF16, 16, 32)))
    xp = dev(np.zeros((2, 8 * 32), np.uint32))
    with pytest.raises(ValueError, match="does not fit"):
        linear_rows(xp, w, dev(np.zeros((9, 32), np.float32)))
    with pytest.raises(ValueError, match="xp must have shape"):
        linear_rows(xp, w, dev(np.zeros((17, 16), np.float32)))  # 17 tokens: three groups
    with pytest.raises(ValueError, match="does not fit"):  # swiglu: out [M, N / 2]
        linear_rows(xp, w, dev(np.zeros((9, 16), np.float32)), swiglu=True)
