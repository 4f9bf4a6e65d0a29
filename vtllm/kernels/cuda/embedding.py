"""Embedding lookup on the GPU: rows of a weight matrix in any QType, decoded to float32.

Decodes with _device.any_weight (_linear_kquant.kquant_weight for K-quant and Q5 rows), the
same per-element decoders linear's kernels use, so a tied lm_head and the embedding see the
same floats for the same weights.
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR, any_weight
from vtllm.kernels.cuda._host import check, weight_view
from vtllm.kernels.cuda._linear_kquant import Q2_K, Q5_0, Q5_1, Q6_K, kquant_weight
from vtllm.kernels.cuda._ptx import grid_dependency_sync

THREADS = 32 if SIMULATOR else 256  # threads per row (the simulator runs each as a thread)


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
