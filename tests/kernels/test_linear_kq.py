"""K-quant weights (Q2_K .. Q8_K) and Q5_0 / Q5_1 in the float32 kernels: decoding equal to
gguf-py's to the bit, linear against the float64 reference, and the batch-invariance law of
linear.py."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from tests.kernels.kquant_blocks import PER_TYPE, random_kquant
from vtllm.kernels import QType
from vtllm.kernels.cpu import linear_kq
from vtllm.kernels.cpu.embedding import embedding
from vtllm.kernels.cpu.linear import MC, NC, NC_MIN, linear
from vtllm.kernels.cpu.quant import dequantize
from vtllm.kernels.reference import embedding_ref, linear_ref

ids = pytest.mark.parametrize("qtype", PER_TYPE, ids=lambda q: q.name)


def run(x, w, qtype, bias=None):
    out = np.full((x.shape[0], w.shape[0]), np.nan, np.float32)
    linear(x, w, qtype, out, bias=bias)
    return out


def check_close(out, x, w, qtype, bias=None):
    ref = linear_ref(x, w, qtype, bias)
    mag = np.abs(x.astype(np.float64)) @ np.abs(dequantize(w, qtype).astype(np.float64)).T
    np.testing.assert_array_less(np.abs(out - ref), 1e-5 * mag + 1e-6)


@ids
def test_embedding_decodes_as_gguf(rng, qtype):
    """Every row decoded by the kernel equals gguf-py's dequantization, bit for bit."""
    w = random_kquant(rng, qtype, 40, 512, lo=-7.5, hi=0.5)
    out = np.full((40, 512), np.nan, np.float32)
    embedding(np.arange(40, dtype=np.int32), w, qtype, out)
    if qtype != QType.Q8_K:  # gguf-py has no Q8_K decoder (files never store it)
        gg = gguf_dequantize(w, GGMLQuantizationType(int(qtype)))
        assert np.array_equal(out, gg.reshape(40, 512))
    assert np.array_equal(out, embedding_ref(np.arange(40), w, qtype).astype(np.float32))


@ids
@pytest.mark.parametrize("m", [1, 3, "gemm", 37])
def test_matches_reference(rng, qtype, m):
    m = linear_kq.GEMM_MIN_M if m == "gemm" else m
    for n, k in [(37, 256), (5, 768), (64, 512)]:
        w = random_kquant(rng, qtype, n, k)
        x = rng.standard_normal((m, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        check_close(run(x, w, qtype), x, w, qtype)
        check_close(run(x, w, qtype, bias), x, w, qtype, bias)


@ids
def test_batch_invariance(rng, threads, qtype):
    """Rows alone (GEMV), in small and large batches (GEMM, several tiles and row panels), with
    1 and 2 threads: the same bits."""
    n, k = NC + 37, 512
    w = random_kquant(rng, qtype, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((MC + 37, k)).astype(np.float32)
    with threads(2):
        full = run(x, w, qtype, bias)
    with threads(1):
        assert np.array_equal(run(x, w, qtype, bias), full)
        assert np.array_equal(run(x[40:77], w, qtype, bias), full[40:77])
    with threads(2):
        g = linear_kq.GEMM_MIN_M
        for lo, hi in [(3, 4), (MC + 30, MC + 33), (10, 10 + g - 1), (20, 20 + g), (0, 37)]:
            assert np.array_equal(run(x[lo:hi], w, qtype, bias), full[lo:hi]), (lo, hi)
        other = rng.standard_normal((7, k)).astype(np.float32)
        mixed = np.concatenate([other[:3], x[5:6], other[3:]])
        assert np.array_equal(run(mixed, w, qtype, bias)[3], full[5])
    check_close(full, x, w, qtype, bias)
    for tile_rows in (NC_MIN, NC):  # the tile size never shows in the bits either
        out = np.empty_like(full)
        linear_kq.kernels(int(qtype))[1](x, w, bias, out, tile_rows)
        assert np.array_equal(out, full)


def test_tied_head_sees_the_embedding_rows(rng):
    """A one-hot x through linear picks out exactly the embedding's decoded row."""
    for qtype in (QType.Q4_K, QType.Q6_K):
        w = random_kquant(rng, qtype, 9, 256)
        rows = np.full((9, 256), np.nan, np.float32)
        embedding(np.arange(9, dtype=np.int32), w, qtype, rows)
        eye = np.eye(256, dtype=np.float32)
        for m in (1, 256):
            assert np.array_equal(run(eye[:m], w, qtype), rows.T[:m])


def test_bad_shapes(rng):
    w = random_kquant(rng, QType.Q4_K, 8, 512)
    out = np.empty((2, 8), np.float32)
    for x, ww in [
        (rng.standard_normal((2, 384)).astype(np.float32), w[:, :216]),  # K % 256 != 0
        (rng.standard_normal((2, 512)).astype(np.float32), w[:, :-1]),
        (rng.standard_normal((2, 256)).astype(np.float32), w),
    ]:
        with pytest.raises(ValueError):
            linear(x, ww, QType.Q4_K, out)


def test_cache_entries_follow_the_decoders():
    """The kernels inline kquant's decoders and _kq8simd's unpacking: their cache stamps cover
    those files, so an edit there recompiles them instead of loading stale machine code."""
    stamp = str(linear_kq._gemv_q4k._cache._cache_file._source_stamp)
    assert "kquant.py" in stamp and "_kq8simd.py" in stamp and "_simd.py" in stamp
