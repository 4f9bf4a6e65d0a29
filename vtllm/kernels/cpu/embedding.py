"""Embedding lookup: rows of a weight matrix in any QType, decoded to float32.

Uses quant.dequant_row, the decoder that builds linear's GEMM tiles, so a tied lm_head and the
embedding see the same floats for the same weights.
"""

import numpy as np
from numba import njit
from numba.core import types

from vtllm.kernels import PER_TYPE
from vtllm.kernels.cpu._simd import carray
from vtllm.kernels.cpu.quant import dequant_row, weight_rows

_SIG = types.int64(
    carray(types.int32, 1, True),
    carray(types.uint8, 2, True),
    types.int64,
    carray(types.float32, 2),
)


@njit(_SIG, nogil=True, cache=True)
def _embedding_kernel(token_ids, w, qt, out):
    T, K = out.shape
    for t in range(T):  # validate every id before writing anything
        if token_ids[t] < 0 or token_ids[t] >= w.shape[0]:
            return t
    of = out.reshape(T * K)
    for t in range(T):
        dequant_row(w, qt, token_ids[t], K, of, t * K)
    return -1


def embedding(token_ids: np.ndarray, w: np.ndarray, qtype, out: np.ndarray) -> None:
    """out[T, K] = row token_ids[t] of W for each t; W is (w, qtype) as in vtllm.kernels."""
    if not (
        isinstance(token_ids, np.ndarray)
        and token_ids.dtype == np.int32
        and token_ids.ndim == 1
        and token_ids.flags.c_contiguous
    ):
        raise ValueError(
            f"embedding: token_ids must be contiguous int32 [T], got "
            f"{getattr(token_ids, 'dtype', type(token_ids))}"
        )
    t = token_ids.shape[0]
    if not (
        isinstance(out, np.ndarray)
        and out.dtype == np.float32
        and out.ndim == 2
        and out.shape[0] == t
        and out.flags.c_contiguous
    ):
        raise ValueError(
            f"embedding: out must be C-contiguous float32 [{t}, K], got "
            f"{getattr(out, 'dtype', type(out))} {getattr(out, 'shape', '')}"
        )
    wb = weight_rows(w, qtype, out.shape[1], "embedding")
    kernel = _embedding_kernel
    if qtype in PER_TYPE:  # compiled on first use (see linear_kq)
        from vtllm.kernels.cpu.linear_kq import embedding_kernel as kernel
    bad = kernel(token_ids, wb, int(qtype), out)
    if bad >= 0:
        raise ValueError(
            f"embedding: token id {token_ids[bad]} at {bad} is outside [0, {w.shape[0]})"
        )
