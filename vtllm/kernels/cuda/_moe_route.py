"""The router's top-k and the experts' combine on the GPU, with kernels/cpu/moe's semantics.
Hot path: keep it lean.

route: one thread per token. The softmax runs in float64 and is rounded once (the float32
probabilities closest to exact, as the CPU kernel computes them), then k passes of argmax with
strict > over ascending experts, so ties go to the lower index. The probabilities overwrite
the logits row in place and a taken expert's is set to TAKEN (probabilities are never
negative): no scratch per token, whatever the expert count. A row of NaN (a padded row of a
graph step) still picks k distinct experts, 0 .. k-1, so the GEMV that follows reads no
expert outside the layer.
combine: out[t] = sum over r, in rank order, of weights[t, r] * ys[t * k + r]: the first
product, then one fused multiply-add per rank (kernels/cpu/moe.combine's order).
"""

import math

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR, fma32, fmax
from vtllm.kernels.cuda._ptx import grid_dependency_sync

ROUTE_THREADS = 32 if SIMULATOR else 128
COMBINE_THREADS = 32 if SIMULATOR else 256
MAX_BLOCKS = 4 if SIMULATOR else 4096  # the combine's grid-stride loop covers the rest
TAKEN = np.float32(-1.0)


@cuda.jit(cache=True)
def _route_kernel(logits, renormalize, ids, weights):
    grid_dependency_sync()
    t = cuda.grid(1)
    if t >= logits.shape[0]:
        return
    num_experts, k = logits.shape[1], ids.shape[1]
    top = -math.inf
    for e in range(num_experts):
        top = fmax(top, np.float64(logits[t, e]))
    total = 0.0
    for e in range(num_experts):
        total += math.exp(np.float64(logits[t, e]) - top)
    for e in range(num_experts):
        logits[t, e] = np.float32(math.exp(np.float64(logits[t, e]) - top) / total)
    kept = np.float32(0.0)
    for r in range(k):
        best = -1
        for e in range(num_experts):
            p = logits[t, e]
            if p != TAKEN and (best < 0 or p > logits[t, best]):
                best = e
        w = logits[t, best]
        ids[t, r] = best
        weights[t, r] = w
        kept += w
        logits[t, best] = TAKEN
    if renormalize:
        for r in range(k):
            weights[t, r] = weights[t, r] / kept


@cuda.jit(cache=True)
def _combine_kernel(ys, weights, accumulate, out):
    grid_dependency_sync()
    k, hidden = weights.shape[1], out.shape[1]
    for j in range(cuda.grid(1), out.shape[0] * hidden, cuda.gridsize(1)):
        t, i = j // hidden, j % hidden
        row = t * k
        s = weights[t, 0] * ys[row, i]
        for r in range(1, k):
            s = fma32(weights[t, r], ys[row + r, i], s)
        out[t, i] = out[t, i] + s if accumulate else s


def route(logits, renormalize: bool, ids, weights, stream) -> None:
    t = logits.shape[0]
    blocks = -(-t // ROUTE_THREADS)
    _route_kernel[blocks, ROUTE_THREADS, stream](logits, renormalize, ids, weights)


def combine(ys, weights, accumulate: bool, out, stream) -> None:
    total = out.shape[0] * out.shape[1]
    blocks = min(MAX_BLOCKS, -(-total // COMBINE_THREADS))
    _combine_kernel[blocks, COMBINE_THREADS, stream](ys, weights, accumulate, out)
