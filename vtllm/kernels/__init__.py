"""Compute kernels: numba njit on the CPU (cpu/), numba.cuda on GPUs (cuda/), numpy references.

Leaf package: imports nothing else of vtllm. Weight matrices are passed as (data, qtype):
- QType.F32: float32 [N, K]; F16: float16 [N, K]; BF16: uint16 bits [N, K]
- QType.Q4_0 / Q4_1 / Q8_0: uint8 [N, K // 32 * BLOCK_BYTES[qtype]], GGML block layout, row-major
- QType.Q5_0 / Q5_1: uint8 [N, K // 32 * Q5_BYTES[qtype]], GGML block layout, row-major
- QType.Q2_K .. Q8_K (K-quants): uint8 [N, K // 256 * KQUANT_BYTES[qtype]], GGML super-blocks of
  256 weights, row-major
- FP8_ROWS: uint8 [N, K + 4], each row's K e4m3fn codes, then its float32 scale (little-endian)
"""

from enum import IntEnum


class QType(IntEnum):
    """Weight storage types, numbered as GGML numbers them."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    BF16 = 30


# FP8 weights with a scale per row (per-tensor or per-output-channel FP8 checkpoints), as the
# CUDA backend keeps them (kernels/cuda/_fp8); the CPU gets them dequantized to F32 (models/fp8).
# Not a GGML type, so not a QType member: the GGML-numbered sets and their tests stay as they are.
FP8_ROWS = 1000

QK = 32  # weights per quantized block
BLOCK_BYTES = {QType.Q4_0: 18, QType.Q4_1: 20, QType.Q8_0: 34}
QUANTIZED = frozenset(BLOCK_BYTES)
QK_K = 256  # weights per K-quant super-block
KQUANT_BYTES = {
    QType.Q2_K: 84,
    QType.Q3_K: 110,
    QType.Q4_K: 144,
    QType.Q5_K: 176,
    QType.Q6_K: 210,
    QType.Q8_K: 292,
}
KQUANTS = frozenset(KQUANT_BYTES)
# Q5_0 / Q5_1: what llama.cpp's K-quant mixes fall back to where K is no multiple of 256
Q5_BYTES = {QType.Q5_0: 22, QType.Q5_1: 24}
# types whose CPU kernels are compiled per type on first use (cpu/linear_kq); on CUDA they
# have a GEMV of their own (cuda/_linear_kquant), Q8_K (activations only) none
PER_TYPE = KQUANTS | frozenset(Q5_BYTES)


def block_layout(qtype) -> tuple[int, int] | None:
    """(weights per block, bytes per block) of a block-quantized type, None for float types."""
    if qtype in BLOCK_BYTES:
        return QK, BLOCK_BYTES[qtype]
    if qtype in Q5_BYTES:
        return QK, Q5_BYTES[qtype]
    if qtype in KQUANT_BYTES:
        return QK_K, KQUANT_BYTES[qtype]
    return None


def check_attention_shapes(op, q, out, k_cache, v_cache, block_tables, seq_lens, query_start_loc):
    """ValueError unless paged attention's arrays (either backend's: only shapes are read) fit
    together: out like q [T, Hq, D], both caches [.., .., Hk, D] with Hk dividing Hq, one
    block-table row and one seq_lens entry per sequence, query_start_loc one longer."""
    s = seq_lens.shape[0]
    if (
        tuple(out.shape) != tuple(q.shape)
        or tuple(v_cache.shape) != tuple(k_cache.shape)
        or k_cache.shape[3] != q.shape[2]
        or q.shape[1] % k_cache.shape[2]
        or tuple(query_start_loc.shape) != (s + 1,)
        or block_tables.shape[0] != s
    ):
        raise ValueError(
            f"{op}: shapes do not match: q {q.shape}, out {out.shape}, "
            f"k_cache {k_cache.shape}, v_cache {v_cache.shape}, block_tables "
            f"{block_tables.shape}, seq_lens {seq_lens.shape}, query_start_loc "
            f"{query_start_loc.shape}"
        )
