"""Data movement the CUDA forward needs between the math kernels. Hot path: keep it lean.

  gather_tokens: a step's input ids read from the device token mirror (token_ids[slot, pos]),
      so a step can name a token the host has not seen yet (depth 2);
  gather_rows: rows of a matrix picked by a device index list (the rows whose logits a step
      wants).
Padding (slot or row index -1) writes a harmless value (id 0, a zero row), never reads out of
range: the indices live on the device, so the launchers cannot check them.
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR
from vtllm.kernels.cuda._host import check, grid_blocks
from vtllm.kernels.cuda._ptx import grid_dependency_sync

THREADS = 32 if SIMULATOR else 256
MAX_BLOCKS = 4 if SIMULATOR else 4096  # grid-stride loops cover the rest


@cuda.jit(cache=True)
def _gather_tokens_kernel(token_ids, slots, positions, out_ids):
    grid_dependency_sync()
    for t in range(cuda.grid(1), out_ids.shape[0], cuda.gridsize(1)):
        s, p = slots[t], positions[t]
        ok = 0 <= s < token_ids.shape[0] and 0 <= p < token_ids.shape[1]
        out_ids[t] = token_ids[s, p] if ok else 0


def gather_tokens(token_ids, slots, positions, out_ids, *, stream=0) -> None:
    """out_ids[t] = token_ids[slots[t], positions[t]]; 0 where the slot or position is out of
    range (padding is slot -1). token_ids [max_slots, max_len] int32; the rest [T] int32."""
    check("gather_tokens", "token_ids", token_ids, np.int32, 2)
    check("gather_tokens", "out_ids", out_ids, np.int32, 1)
    n = out_ids.shape[0]
    check("gather_tokens", "slots", slots, np.int32, 1, (n,))
    check("gather_tokens", "positions", positions, np.int32, 1, (n,))
    if n:
        blocks = min(MAX_BLOCKS, grid_blocks(n, THREADS))
        _gather_tokens_kernel[blocks, THREADS, stream](token_ids, slots, positions, out_ids)


@cuda.jit(cache=True)
def _gather_rows_kernel(x, rows, out):
    grid_dependency_sync()
    width = out.shape[1]
    total = out.shape[0] * width
    for j in range(cuda.grid(1), total, cuda.gridsize(1)):
        r, c = j // width, j % width
        src = rows[r]
        out[r, c] = x[src, c] if 0 <= src < x.shape[0] else np.float32(0.0)


def gather_rows(x, rows, out, *, stream=0) -> None:
    """out[r] = x[rows[r]] (a zero row where rows[r] is out of range). float32 [N, W] -> [R, W]."""
    check("gather_rows", "x", x, np.float32, 2)
    check("gather_rows", "rows", rows, np.int32, 1)
    check("gather_rows", "out", out, np.float32, 2, (rows.shape[0], x.shape[1]))
    total = out.shape[0] * out.shape[1]
    if total:
        blocks = min(MAX_BLOCKS, grid_blocks(total, THREADS))
        _gather_rows_kernel[blocks, THREADS, stream](x, rows, out)
