"""The data movement a tensor-parallel rank's forward needs around its collectives
(executor/cuda_tp_ops). Hot path: keep it lean.

  embedding_shard: a vocab-parallel lookup: row id - start of the rank's shard of the embedding
      for the ids inside it, a zero row for every other id, so that the all-reduce over the
      ranks that follows gives each id its row (one non-zero term: exact). Rows decode through
      embedding's own per-element decoder, so a rank's rows are the unsharded lookup's bits.
  unshard_columns: the logits all-gathered rank by rank, [world, R, width] (rank r's vocab
      columns [r * width, (r + 1) * width)), as whole rows [R, V] for the sampler; V may be
      less than world * width (the last shard's padding columns are dropped).
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR
from vtllm.kernels.cuda._host import check, grid_blocks, weight_view
from vtllm.kernels.cuda._ptx import grid_dependency_sync
from vtllm.kernels.cuda.embedding import _weight

THREADS = 32 if SIMULATOR else 256
MAX_BLOCKS = 4 if SIMULATOR else 4096  # grid-stride loops cover the rest


@cuda.jit(cache=True)
def _embedding_shard_kernel(token_ids, w, qt, start, out):
    grid_dependency_sync()
    t = cuda.blockIdx.x
    row = token_ids[t] - start
    inside = 0 <= row and row < w.shape[0]
    for k in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        if inside:
            out[t, k] = _weight(w, row, k, qt)
        else:
            out[t, k] = np.float32(0.0)


def embedding_shard(token_ids, w, qtype, start: int, out, *, stream=0) -> None:
    """out[t] = row token_ids[t] - start of W (the shard's N rows, any QType as in
    vtllm.kernels), or a zero row where that falls outside [0, N). token_ids [T] int32,
    out [T, K] float32, on the device."""
    check("embedding_shard", "token_ids", token_ids, np.int32, 1)
    t = token_ids.shape[0]
    check("embedding_shard", "out", out, np.float32, 2)
    if out.shape[0] != t:
        raise ValueError(f"embedding_shard: out has {out.shape[0]} rows for {t} token ids")
    wv, qt = weight_view("embedding_shard", w, qtype, out.shape[1])
    if t == 0 or out.shape[1] == 0:
        return
    _embedding_shard_kernel[t, THREADS, stream](token_ids, wv, qt, np.int32(start), out)


@cuda.jit(cache=True)
def _unshard_columns_kernel(parts, out):
    grid_dependency_sync()
    width, vocab = parts.shape[2], out.shape[1]
    total = out.shape[0] * vocab
    for j in range(cuda.grid(1), total, cuda.gridsize(1)):
        r, c = j // vocab, j % vocab
        out[r, c] = parts[c // width, r, c % width]


def unshard_columns(parts, out, *, stream=0) -> None:
    """out[r, c] = parts[c // width, r, c % width]: parts [world, R, width] float32, out [R, V]
    float32 with (world - 1) * width < V <= world * width."""
    check("unshard_columns", "parts", parts, np.float32, 3)
    world, rows, width = parts.shape
    check("unshard_columns", "out", out, np.float32, 2)
    vocab = out.shape[1]
    if out.shape[0] != rows or not (world - 1) * width < vocab <= world * width:
        raise ValueError(
            f"unshard_columns: out {tuple(out.shape)} does not take parts {tuple(parts.shape)}"
        )
    total = rows * vocab
    if total:
        blocks = min(MAX_BLOCKS, grid_blocks(total, THREADS))
        _unshard_columns_kernel[blocks, THREADS, stream](parts, out)
