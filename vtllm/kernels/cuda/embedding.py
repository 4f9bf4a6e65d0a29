"""Embedding lookup on the GPU: rows of a weight matrix in any QType, decoded to float32.

Decodes with _device.any_weight (_linear_kquant.kquant_weight for K-quant and Q5 rows), the
same per-element decoders linear's kernels use, so a tied lm_head and the embedding see the
same floats for the same weights.

embedding_scaled is Gemma's: rows times a factor, where F16 / BF16 rows round the factor and
the product to their type (HF computes it in the model's dtype), to nearest even, as
executor/cpu_ops._round_to does on the host.
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import BF16, F16, SIMULATOR, any_weight, as_f32, f32_bits
from vtllm.kernels.cuda._host import check, weight_view
from vtllm.kernels.cuda._linear_kquant import Q2_K, Q5_0, Q5_1, Q6_K, kquant_weight
from vtllm.kernels.cuda._ptx import grid_dependency_sync

THREADS = 32 if SIMULATOR else 256  # threads per row (the simulator runs each as a thread)
_ROUND_INT = np.float32(1.5 * 2.0**23)  # (y + this) - this: y rounded to an integer, ties even


@cuda.jit(device=True)
def _weight(w, r, k, qt):
    if (Q2_K <= qt and qt <= Q6_K) or qt == Q5_0 or qt == Q5_1:
        return kquant_weight(w, r, k, qt)
    return any_weight(w, r, k, qt)


@cuda.jit(cache=True)
def _embedding_kernel(token_ids, w, qt, out):
    grid_dependency_sync()
    t = cuda.blockIdx.x
    tok = token_ids[t]
    if tok < 0 or tok >= w.shape[0]:  # padding (-1) or a bad id: the row is left unwritten
        return
    for k in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        out[t, k] = _weight(w, tok, k, qt)


def embedding(token_ids, w, qtype, out, *, stream=0) -> None:
    """out[T, K] = row token_ids[t] of W for each t; W is (w, qtype) as in vtllm.kernels, on the
    device. Rows whose id is outside [0, N) (padding is -1) are skipped, not checked: the ids
    live on the device and a launcher never synchronizes."""
    check("embedding", "token_ids", token_ids, np.int32, 1)
    t = token_ids.shape[0]
    check("embedding", "out", out, np.float32, 2)
    if out.shape[0] != t:
        raise ValueError(f"embedding: out has {out.shape[0]} rows for {t} token ids")
    wv, qt = weight_view("embedding", w, qtype, out.shape[1])
    if t == 0 or out.shape[1] == 0:
        return
    _embedding_kernel[t, THREADS, stream](token_ids, wv, qt, out)


@cuda.jit(device=True)
def round_to(x, qt):
    """float32 x rounded to the nearest F16 / BF16 value (ties to even) when qt is one of them;
    else x. F16: overflow to inf, subnormals on their 2^-24 grid, as numpy's cast gives."""
    if qt == BF16:
        b = f32_bits(x)
        return as_f32((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000)
    if qt != F16:
        return x
    b = f32_bits(x)
    sign, a = b & 0x80000000, b & 0x7FFFFFFF
    if a >= 0x7F800000:  # inf, nan
        return x
    if a >= 0x477FF000:  # from 65520 (halfway past the largest half, 65504) on: inf
        return as_f32(sign | 0x7F800000)
    if a < 0x38800000:  # under 2^-14: a multiple of 2^-24 (the scalings are exact)
        y = as_f32(a) * np.float32(2.0**24)
        return as_f32(sign | f32_bits(((y + _ROUND_INT) - _ROUND_INT) * np.float32(2.0**-24)))
    return as_f32(sign | ((a + 0xFFF + ((a >> 13) & 1)) & 0xFFFFE000))


@cuda.jit(cache=True)
def _embedding_scaled_kernel(token_ids, w, qt, factor, out):
    grid_dependency_sync()
    t = cuda.blockIdx.x
    tok = token_ids[t]
    if tok < 0 or tok >= w.shape[0]:
        return
    f = round_to(factor, qt)
    for k in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        out[t, k] = round_to(_weight(w, tok, k, qt) * f, qt)


def embedding_scaled(token_ids, w, qtype, factor: float, out, *, stream=0) -> None:
    """embedding, each row times factor (both rounded to F16 / BF16 for such W: the module
    docstring)."""
    check("embedding_scaled", "token_ids", token_ids, np.int32, 1)
    t = token_ids.shape[0]
    check("embedding_scaled", "out", out, np.float32, 2)
    if out.shape[0] != t:
        raise ValueError(f"embedding_scaled: out has {out.shape[0]} rows for {t} token ids")
    wv, qt = weight_view("embedding_scaled", w, qtype, out.shape[1])
    if t == 0 or out.shape[1] == 0:
        return
    _embedding_scaled_kernel[t, THREADS, stream](token_ids, wv, qt, np.float32(factor), out)
