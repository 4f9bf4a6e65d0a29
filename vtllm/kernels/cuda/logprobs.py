"""Raw log-softmax on the GPU: logprobs of sampled and prompt tokens, as kernels/cpu/logprobs.py
computes them (the raw logits, before bias, penalties or temperature; rank and top order by raw
logit, ties by lower id). Hot path when asked for: keep it lean.

One block per row. A single pass keeps, per thread, its own n best (value, id) in a sorted
local list and its max; a second pass sums exp(x - max) in float64 (0 at or below EXP_CUTOFF,
as the CPU) and counts the tokens ranked before the chosen one. The top n are then merged from
the threads' lists with n block argmax rounds, so the row is read twice whatever n is.
"""

import math
from typing import NamedTuple

import numpy as np
from numba import cuda, float32, float64, int32

from vtllm.kernels.cuda._device import (
    MAX_WARPS,
    NEG_INF,
    SIMULATOR,
    block_argmax,
    block_max,
    block_sum,
    fmax,
    imin,
)
from vtllm.kernels.cuda._host import check
from vtllm.kernels.cuda._ptx import grid_dependency_sync
from vtllm.kernels.sampling_table import EXP_CUTOFF, MAX_TOP_LOGPROBS

__all__ = ["LogprobsOut", "prompt_logprobs"]

THREADS = 32 if SIMULATOR else 256


class LogprobsOut(NamedTuple):
    """Device counterpart of kernels.cpu LogprobsOut: same fields, same meaning."""

    logprob: object  # [B] float32
    rank: object  # [B] int32; 1 = most likely
    top_ids: object  # [B, MAX_TOP_LOGPROBS] int32; -1 past the row's count
    top_logprobs: object  # [B, MAX_TOP_LOGPROBS] float32; -inf past the row's count

    @classmethod
    def create(cls, n: int, *, stream=0) -> "LogprobsOut":
        shape = (n, MAX_TOP_LOGPROBS)
        return cls(
            cuda.device_array(n, np.float32, stream=stream),
            cuda.device_array(n, np.int32, stream=stream),
            cuda.device_array(shape, np.int32, stream=stream),
            cuda.device_array(shape, np.float32, stream=stream),
        )


@cuda.jit(device=True)
def prob(x, m, inv_t):
    """Unnormalized probability of logit x: exp((x - m) / T), 0 at or below EXP_CUTOFF."""
    s = (np.float64(x) - m) * inv_t
    return math.exp(s) if s > EXP_CUTOFF else 0.0


@cuda.jit(device=True)
def raw_logprobs(logits, r, chosen, n, out_lp, out_rank, out_ids, out_lps, sf, sd, si):
    """Row r: logprob and rank of chosen (nan and 0 unless 0 <= chosen < V) and the top n
    into out_*[r]; columns past n get -1 / -inf. sf / sd / si: shared [MAX_WARPS] float32 /
    float64 / int32."""
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = logits.shape[1]
    lv = cuda.local.array(MAX_TOP_LOGPROBS, float32)
    li = cuda.local.array(MAX_TOP_LOGPROBS, int32)
    ln, mx = 0, NEG_INF
    for i in range(tid, V, nt):  # increasing ids: '>' keeps an equal earlier id ahead
        x = logits[r, i]
        mx = fmax(mx, x)
        if n > 0 and (ln < n or x > lv[n - 1]):
            j = ln if ln < n else n - 1
            while j > 0 and x > lv[j - 1]:
                lv[j], li[j] = lv[j - 1], li[j - 1]
                j -= 1
            lv[j], li[j] = x, i
            if ln < n:
                ln += 1
    m = np.float64(block_max(mx, sf))
    valid = 0 <= chosen < V
    xc = logits[r, chosen] if valid else NEG_INF
    z, before = 0.0, np.int32(0)
    for i in range(tid, V, nt):
        x = logits[r, i]
        z += prob(x, m, 1.0)
        if x > xc or (x == xc and i < chosen):
            before += 1
    z = block_sum(z, sd)
    before = block_sum(before, si)
    lse = m + math.log(z)
    if tid == 0:
        out_lp[r] = np.float32(np.float64(xc) - lse) if valid else np.float32(np.nan)
        out_rank[r] = before + 1 if valid else 0
    for j in range(n + tid, out_ids.shape[1], nt):
        out_ids[r, j], out_lps[r, j] = -1, NEG_INF
    h = 0
    for j in range(n):  # merge the threads' lists: one block argmax per place
        v = lv[h] if h < ln else NEG_INF
        i = li[h] if h < ln else np.int32(V)
        bv, bi = block_argmax(v, i, sf, si)
        if h < ln and li[h] == bi:
            h += 1
        if tid == 0:
            out_ids[r, j] = bi if bi < V else -1
            out_lps[r, j] = np.float32(np.float64(bv) - lse) if bi < V else NEG_INF


@cuda.jit(cache=True)
def _sample_logprobs_kernel(logits, slots, num_logprobs, out_tokens, lp, rank, ids, lps):
    grid_dependency_sync()
    b = cuda.blockIdx.x
    sf = cuda.shared.array(MAX_WARPS, float32)
    sd = cuda.shared.array(MAX_WARPS, float64)
    si = cuda.shared.array(MAX_WARPS, int32)
    s, tok = slots[b], out_tokens[b]
    if s < 0 or s >= num_logprobs.shape[0] or tok < 0 or num_logprobs[s] < 0:
        return  # padding, rows the sampler skipped, and slots without logprobs: untouched
    raw_logprobs(
        logits, b, tok, imin(num_logprobs[s], ids.shape[1]), lp, rank, ids, lps, sf, sd, si
    )


@cuda.jit(cache=True)
def _prompt_logprobs_kernel(logits, next_ids, k, lp, rank, ids, lps):
    grid_dependency_sync()
    t = cuda.blockIdx.x
    sf = cuda.shared.array(MAX_WARPS, float32)
    sd = cuda.shared.array(MAX_WARPS, float64)
    si = cuda.shared.array(MAX_WARPS, int32)
    raw_logprobs(logits, t, next_ids[t], k, lp, rank, ids, lps, sf, sd, si)


def check_logprobs_out(op: str, out, B: int) -> None:
    for name, a, dtype, shape in zip(
        LogprobsOut._fields,
        out,
        (np.float32, np.int32, np.int32, np.float32),
        ((B,), (B,), (B, MAX_TOP_LOGPROBS), (B, MAX_TOP_LOGPROBS)),
        strict=True,
    ):
        check(op, f"out_logprobs.{name}", a, dtype, len(shape), shape)


def launch_sample_logprobs(logits, slots, num_logprobs, out_tokens, out, stream) -> None:
    """Logprobs of the tokens sample() just wrote into out_tokens (same stream, so in order)."""
    _sample_logprobs_kernel[logits.shape[0], THREADS, stream](
        logits, slots, num_logprobs, out_tokens, *out
    )


def prompt_logprobs(
    logits, next_ids, k, out_logprob, out_rank, out_top_ids, out_top_logprobs, *, stream=0
) -> None:
    """Raw log_softmax at each position t of logits [T, V] float32 (device arrays): logprob
    and rank of next_ids[t] (-1, or any id outside the vocabulary: nan and rank 0) and the top
    k <= 20 into out_top_* [T, >= k]; columns past k get -1 / -inf."""
    op = "prompt_logprobs"
    check(op, "logits", logits, np.float32, 2)
    T = logits.shape[0]
    check(op, "next_ids", next_ids, np.int32, 1, (T,))
    check(op, "out_logprob", out_logprob, np.float32, 1, (T,))
    check(op, "out_rank", out_rank, np.int32, 1, (T,))
    check(op, "out_top_ids", out_top_ids, np.int32, 2)
    check(op, "out_top_logprobs", out_top_logprobs, np.float32, 2, out_top_ids.shape)
    if out_top_ids.shape[0] != T:
        raise ValueError(f"{op}: out_top_ids has {out_top_ids.shape[0]} rows, expected {T}")
    if not 0 <= k <= min(MAX_TOP_LOGPROBS, out_top_ids.shape[1]):
        raise ValueError(f"{op}: k = {k} must be in [0, min(20, out_top_ids.shape[1])]")
    if T == 0:
        return
    if logits.shape[1] == 0:
        raise ValueError(f"{op}: empty vocabulary")
    _prompt_logprobs_kernel[T, THREADS, stream](
        logits, next_ids, np.int64(k), out_logprob, out_rank, out_top_ids, out_top_logprobs
    )
