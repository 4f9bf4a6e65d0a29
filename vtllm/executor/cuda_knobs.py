"""The CUDA runner's knobs, checked before anything is allocated, and the sizes they imply."""

from vtllm.errors import InvalidParameter
from vtllm.kernels.cuda import KV_DTYPES, WGMMA
from vtllm.kernels.cuda.attention import scratch_row_bytes

# how x enters the products with bf16 W on the tensor cores: split into two bf16 (about
# float32's precision) or rounded to one (half the mmas; kernels/cuda/_linear_mma.py)
MATMUL_INPUT_DTYPES = ("float32", "bfloat16")

# A step's leading rows whose attention goes through the decode kernels, which spread each
# row's keys over blocks, when VT_CUDA_SPLIT_ATTENTION_ROWS is 0: enough for a serving step's
# prompt chunk beside its decodes, so that the prompt's rows do not queue in the prefill
# kernel after the decodes (kernels/cuda/attention.paged_attention; BENCHMARKS.md, GPU serving), as
# long as the scratch for their split states, which grows with max_model_len, stays under
# SPLIT_SCRATCH_BYTES.
SPLIT_ROWS = 256
SPLIT_SCRATCH_BYTES = 512 << 20


def attention_split_rows(
    config, max_num_seqs: int, max_tokens: int, max_positions: int, knob: int
) -> int:
    """The decode kernels' rows: every decode row (max_num_seqs) and, up to the step's size,
    the knob's rows, or with knob 0 up to SPLIT_ROWS that fit in SPLIT_SCRATCH_BYTES."""
    if knob == 0:
        row_bytes = scratch_row_bytes(config.num_heads, config.head_dim, max_positions)
        knob = min(SPLIT_ROWS, SPLIT_SCRATCH_BYTES // row_bytes)
    return min(max_tokens, max(max_num_seqs, knob))


def check_knobs(
    kv_cache_dtype: str, matmul_input_dtype: str, flash_prefill: bool, prefill_gemm: str
) -> None:
    if kv_cache_dtype not in KV_DTYPES:
        raise InvalidParameter(
            f"kv_cache_dtype must be one of {sorted(KV_DTYPES)}, got {kv_cache_dtype!r}",
            param="kv_cache_dtype",
        )
    if matmul_input_dtype not in MATMUL_INPUT_DTYPES:
        raise InvalidParameter(
            f"matmul_input_dtype must be one of {list(MATMUL_INPUT_DTYPES)}, "
            f"got {matmul_input_dtype!r}",
            param="matmul_input_dtype",
        )
    if flash_prefill and kv_cache_dtype != "bfloat16":
        raise InvalidParameter(
            "cuda_flash_prefill needs kv_cache_dtype bfloat16 (its kernel reads bf16 keys "
            f"and values), got {kv_cache_dtype!r}",
            param="cuda_flash_prefill",
        )
    _check_prefill_gemm(prefill_gemm, matmul_input_dtype)


def _check_prefill_gemm(prefill_gemm: str, matmul_input_dtype: str) -> None:
    """wgmma multiplies bf16 inputs only, on Hopper only (gemm_wgmma)."""
    if prefill_gemm not in ("mma", "wgmma"):
        raise InvalidParameter(
            f"cuda_prefill_gemm must be mma or wgmma, got {prefill_gemm!r}",
            param="cuda_prefill_gemm",
        )
    if prefill_gemm == "mma":
        return
    if not WGMMA:
        raise InvalidParameter(
            "cuda_prefill_gemm wgmma needs an sm_90 (Hopper) GPU", param="cuda_prefill_gemm"
        )
    if matmul_input_dtype != "bfloat16":
        raise InvalidParameter(
            "cuda_prefill_gemm wgmma needs matmul_input_dtype bfloat16, "
            f"got {matmul_input_dtype!r}",
            param="cuda_prefill_gemm",
        )
