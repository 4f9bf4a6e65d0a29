"""Token sampler on the GPU, with the CPU sampler's semantics (kernels/cpu/sampling.py). Hot
path: keep it lean, put features in helpers.

Per row, one block, writing the token into out_tokens and the device mirror (token_ids[slot,
position], num_tokens[slot]) so sampled ids never leave the device until the host wants them:
  1. _sampling_adjust: logit bias, min_tokens stop masks, repetition / frequency / presence
     penalties from the mirror history, in float64, for the rows that ask (into scratch);
  2. greedy (temperature < GREEDY_EPS): argmax, ties to the lowest id. The row's max and its
     lowest id come from PARTS blocks a row (`_argmax_parts_kernel`, one slice of the
     vocabulary each, into scratch), which the row's block then reduces: one block reading a
     152k-token row alone would make the argmax the sampler's longest part;
  3. else e_i = exp((w_i - max) / T) in float64 (0 at or below EXP_CUTOFF) and the CPU's
     uniform u = splitmix64(seed, position). With no filter: the first id, in vocabulary
     order, whose running sum of e exceeds u * sum(e) (each thread sums a contiguous chunk;
     chunk sums are added in chunk order). With min_p / top_k / top_p: min_p zeroes e below
     min_p (e is p / p_max), then _sampling_select cuts the row in sampling order (descending
     e, ties by lower id) at the k-th token, then where the mass reaches top_p of what is
     kept, then draws where it exceeds u times what is left;
  4. logprobs (optional): of the raw logits, as the CPU (logprobs.py).
Sums run in another order than the CPU's, so a token can differ from the CPU's only where a
target sits within float64 rounding of a boundary. Every sum is in a fixed order (the filters'
bin masses are exact integers), so a row's token is deterministic run to run.

Over 400 lines: its kernels and launcher share the row's scratch; the adjustments and the
filters' selection are _sampling_adjust and _sampling_select already.
"""

from typing import NamedTuple

import numpy as np
from numba import cuda, float64, int32, int64

from vtllm.kernels.cuda._device import MAX_WARPS, SIMULATOR, block_argmax, block_sum, imin, uniform
from vtllm.kernels.cuda._host import check
from vtllm.kernels.cuda._ptx import grid_dependency_sync
from vtllm.kernels.cuda._sampling_adjust import adjusted, apply_token_masks, launch_adjust
from vtllm.kernels.cuda._sampling_select import ABOVE, AT_LEAST, COUNT, MAX_VOCAB, NBINS, select
from vtllm.kernels.cuda.logprobs import (
    LogprobsOut,
    check_logprobs_out,
    launch_sample_logprobs,
    prob,
)
from vtllm.kernels.sampling_table import GREEDY_EPS, TABLE_LAYOUT, SamplingTable

__all__ = ["SamplerScratch", "apply_token_masks", "device_table", "sample"]

# 512 threads: the sample kernel needs more than 64 registers a thread, so 1024 would not fit
# an SM's 64K registers
THREADS = 32 if SIMULATOR else 512
PARTS = 4 if SIMULATOR else 64  # slices of a row's argmax, a block each (at most THREADS)
PART_THREADS = 32 if SIMULATOR else 256


class SamplerScratch(NamedTuple):
    """Per-row device scratch: at least as many rows as the batch, one column per token."""

    values: object  # [rows, V] float64: adjusted logits, then e for filtered rows
    counts: object  # [rows, V] int32: all zeros between calls (the kernels leave them so)
    part_max: object  # [rows, PARTS] float64: each slice's max of the row
    part_id: object  # [rows, PARTS] int32: and its lowest id (V where none is above -inf)

    @classmethod
    def create(cls, rows: int, vocab: int, *, stream=0) -> "SamplerScratch":
        counts = cuda.to_device(np.zeros((rows, vocab), np.int32), stream=stream)
        return cls(
            cuda.device_array((rows, vocab), np.float64, stream=stream),
            counts,
            cuda.device_array((rows, PARTS), np.float64, stream=stream),
            cuda.device_array((rows, PARTS), np.int32, stream=stream),
        )


@cuda.jit(device=True)
def _w(logits, values, adj, b, i):
    return values[b, i] if adj else np.float64(logits[b, i])


@cuda.jit(device=True)
def _better(x, i, best, bi):
    """(x, i) if x beats best, else (best, bi): ids come in increasing order, so '>' keeps the
    lowest id of a tie."""
    v = np.float64(x)
    if v > best:
        return v, np.int32(i)
    return best, bi


@cuda.jit(device=True)
def _thread_argmax(w, b, i, nt, end, V):
    """Max of row b of w over ids i, i + nt, ... below end (as float64) and its lowest id (V
    if none is above -inf). The scan waits on memory: four loads in flight per trip instead
    of one."""
    best, bi = -np.inf, np.int32(V)
    while i + 3 * nt < end:
        x0, x1, x2, x3 = w[b, i], w[b, i + nt], w[b, i + 2 * nt], w[b, i + 3 * nt]
        best, bi = _better(x0, i, best, bi)
        best, bi = _better(x1, i + nt, best, bi)
        best, bi = _better(x2, i + 2 * nt, best, bi)
        best, bi = _better(x3, i + 3 * nt, best, bi)
        i += 4 * nt
    while i < end:
        best, bi = _better(w[b, i], i, best, bi)
        i += nt
    return best, bi


@cuda.jit(device=True)
def _skipped(slots, positions, token_ids, b):
    """Whether row b is padding (slot -1) or out of range: no token is drawn for it."""
    s, pos = slots[b], positions[b]
    return s < 0 or s >= token_ids.shape[0] or pos < 0 or pos >= token_ids.shape[1]


@cuda.jit(cache=True)
def _argmax_parts_kernel(
    logits,
    slots,
    positions,
    presence,
    frequency,
    repetition,
    min_tokens,
    prompt_len,
    num_bias,
    num_min_stop,
    token_ids,
    values,
    part_max,
    part_id,
):
    """Block (b, p): the max of slice p of row b (the adjusted row where it is adjusted) and
    its lowest id, into part_max / part_id[b, p]."""
    grid_dependency_sync()
    b, p, tid, nt = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, cuda.blockDim.x
    if _skipped(slots, positions, token_ids, b):
        return
    sd = cuda.shared.array(MAX_WARPS, float64)
    si = cuda.shared.array(MAX_WARPS, int32)
    V = logits.shape[1]
    width = (V + cuda.gridDim.y - 1) // cuda.gridDim.y
    lo, hi = p * width, imin(V, p * width + width)
    s, pos = slots[b], positions[b]
    if adjusted(
        s, pos, presence, frequency, repetition, min_tokens, prompt_len, num_bias, num_min_stop
    ):
        best, bi = _thread_argmax(values, b, lo + tid, nt, hi, V)
    else:
        best, bi = _thread_argmax(logits, b, lo + tid, nt, hi, V)
    best, bi = block_argmax(best, bi, sd, si)
    if tid == 0:
        part_max[b, p] = best
        part_id[b, p] = bi


@cuda.jit(device=True)
def _draw_in_id_order(logits, values, adj, b, m, inv_t, u, tm, ri):
    """No filter: the first id whose running sum of e exceeds u * sum(e); fallback the last
    id with e > 0 (or 0 when there is none)."""
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = logits.shape[1]
    chunk = (V + nt - 1) // nt
    lo, hi = imin(V, tid * chunk), imin(V, tid * chunk + chunk)
    acc = 0.0
    for i in range(lo, hi):
        acc += prob(_w(logits, values, adj, b, i), m, inv_t)
    tm[tid] = acc
    if tid == 0:
        ri[0], ri[1] = V, -1
    cuda.syncthreads()
    z, run = 0.0, 0.0
    for t in range(nt):  # every thread adds the chunks in the same order
        if t == tid:
            run = z
        z += tm[t]
    target = u * z
    first, last = np.int64(V), np.int64(-1)
    for i in range(lo, hi):
        e = prob(_w(logits, values, adj, b, i), m, inv_t)
        run += e
        if e > 0.0:
            last = i
            if run > target:
                first = i
                break
    if first < V:
        cuda.atomic.min(ri, 0, first)
    if last >= 0:
        cuda.atomic.max(ri, 1, last)
    cuda.syncthreads()
    return ri[0] if ri[0] < V else (ri[1] if ri[1] >= 0 else np.int64(0))


@cuda.jit(device=True)
def _draw_filtered(logits, values, adj, b, m, inv_t, u, k, p, mp, sd, si, hh, hl, tc, tm, ri, rf):
    """min_p, top_k, top_p on the renormalized rest, then the draw (the CPU's order)."""
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = logits.shape[1]
    c, z = np.int32(0), 0.0
    for i in range(tid, V, nt):  # e replaces w in place: each thread reads only its own i
        e = prob(_w(logits, values, adj, b, i), m, inv_t)
        if mp > 0.0 and e < mp:  # e is p / p_max (the max has e == 1)
            e = 0.0
        values[b, i] = e
        if e > 0.0:
            c += 1
            z += e
    num_pos = block_sum(c, si)
    kept = block_sum(z, sd)
    if num_pos == 0:
        return np.int64(0)
    cut_key, cut_id = np.int64(0), np.int64(-1)  # (0, -1): every token with e > 0
    if 0 < k < num_pos:
        cut_key, cut_id, kept = select(
            values, b, COUNT, np.int64(k), 0.0, cut_key, cut_id, hh, hl, tc, tm, ri, rf
        )
    if p < 1.0:
        cut_key, cut_id, kept = select(
            values, b, AT_LEAST, np.int64(0), p * kept, cut_key, cut_id, hh, hl, tc, tm, ri, rf
        )
    _, tok, _ = select(
        values, b, ABOVE, np.int64(0), u * kept, cut_key, cut_id, hh, hl, tc, tm, ri, rf
    )
    return tok


@cuda.jit(cache=True)
def _sample_kernel(
    logits,
    slots,
    positions,
    temperature,
    seed,
    top_k,
    top_p,
    min_p,
    presence,
    frequency,
    repetition,
    min_tokens,
    prompt_len,
    num_bias,
    num_min_stop,
    token_ids,
    num_tokens,
    values,
    part_max,
    part_id,
    out_tokens,
):
    grid_dependency_sync()
    b, tid, nt = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    V = logits.shape[1]
    s, pos = slots[b], positions[b]
    if _skipped(slots, positions, token_ids, b):
        if tid == 0:  # padding (slot -1), or out of range: token -1, mirror untouched
            out_tokens[b] = -1
        return
    sd = cuda.shared.array(MAX_WARPS, float64)
    si = cuda.shared.array(MAX_WARPS, int32)
    hh = cuda.shared.array(NBINS, int64)
    hl = cuda.shared.array(NBINS, int64)
    tc = cuda.shared.array(THREADS, int32)  # one entry per thread
    tm = cuda.shared.array(THREADS, float64)
    ri = cuda.shared.array(8, int64)
    rf = cuda.shared.array(4, float64)
    adj = adjusted(
        s, pos, presence, frequency, repetition, min_tokens, prompt_len, num_bias, num_min_stop
    )
    best, bi = -np.inf, np.int32(V)  # the slices' maxima (max and lowest id: any order)
    for p in range(tid, part_max.shape[1], nt):
        x, i = part_max[b, p], part_id[b, p]
        if x > best or (x == best and i < bi):
            best, bi = x, i
    best, bi = block_argmax(best, bi, sd, si)
    t = np.float64(temperature[s])
    tok = np.int64(0)  # no finite logit: 0, as the CPU
    if t < GREEDY_EPS:
        tok = bi if bi < V else 0
    elif bi < V:
        k, p, mp = top_k[s], np.float64(top_p[s]), np.float64(min_p[s])
        u = uniform(seed[s], pos)
        if mp > 0.0 or 0 < k < V or p < 1.0:
            tok = _draw_filtered(
                logits, values, adj, b, best, 1.0 / t, u, k, p, mp, sd, si, hh, hl, tc, tm, ri, rf
            )
        else:
            tok = _draw_in_id_order(logits, values, adj, b, best, 1.0 / t, u, tm, ri)
    if tid == 0:
        out_tokens[b] = tok
        token_ids[s, pos] = tok
        num_tokens[s] = pos + 1


def device_table(table: SamplingTable, *, stream=0) -> SamplingTable:
    """A SamplingTable whose arrays are device copies of table's (what sample() reads)."""
    return SamplingTable(
        **{name: cuda.to_device(getattr(table, name), stream=stream) for name in TABLE_LAYOUT}
    )


_scratch_cache: dict = {}


def _default_scratch(B: int, V: int) -> SamplerScratch:
    """Made once per (power-of-two rows, V) and kept for the process: captured graphs may hold
    any of them, so none is ever freed or replaced."""
    rows = 1 << max(B - 1, 0).bit_length()
    key = (rows, V)
    if key not in _scratch_cache:
        _scratch_cache[key] = SamplerScratch.create(rows, V)
    return _scratch_cache[key]


def _check_table(table, S: int) -> None:
    for name, (dtype, width) in TABLE_LAYOUT.items():
        shape = (S, width) if width else (S,)
        check("sample", f"table.{name}", getattr(table, name), dtype, len(shape), shape)


def sample(
    logits,
    slots,
    positions,
    table: SamplingTable,
    token_ids,
    num_tokens,
    out_tokens,
    *,
    out_logprobs: LogprobsOut | None = None,
    scratch: SamplerScratch | None = None,
    stream=0,
) -> None:
    """Sample one token per row into out_tokens and the mirror: token_ids[slot, position] and
    num_tokens[slot] = position + 1. Rows with slot -1 are padding (token -1, nothing written);
    so are rows whose slot or position is out of range (the launcher cannot see device values).

    logits [B, V <= 2^18] float32 (read only); slots, positions, out_tokens [B] int32; token_ids
    [max_slots, max_len] int32; num_tokens [max_slots] int32; table: a SamplingTable of device
    arrays (device_table). A slot may appear once per call. out_logprobs: a LogprobsOut [B]
    (rows whose slot has num_logprobs < 0 are left untouched). scratch: SamplerScratch with
    >= B rows; without it a per-process one is made on first use (so pass one, or call once
    with these shapes, before capturing a graph; concurrent streams need one each)."""
    check("sample", "logits", logits, np.float32, 2)
    B, V = logits.shape
    for name, a in (("slots", slots), ("positions", positions), ("out_tokens", out_tokens)):
        check("sample", name, a, np.int32, 1, (B,))
    check("sample", "token_ids", token_ids, np.int32, 2)
    S = token_ids.shape[0]
    check("sample", "num_tokens", num_tokens, np.int32, 1, (S,))
    _check_table(table, S)
    if out_logprobs is not None:
        check_logprobs_out("sample", out_logprobs, B)
    if scratch is not None:
        rows = scratch.values.shape[0]
        check("sample", "scratch.values", scratch.values, np.float64, 2, (rows, V))
        check("sample", "scratch.counts", scratch.counts, np.int32, 2, (rows, V))
        check("sample", "scratch.part_max", scratch.part_max, np.float64, 2, (rows, PARTS))
        check("sample", "scratch.part_id", scratch.part_id, np.int32, 2, (rows, PARTS))
        if rows < B:
            raise ValueError(f"sample: scratch has {rows} rows, the batch {B}")
    if B == 0:
        return
    if not 0 < V <= MAX_VOCAB:
        raise ValueError(f"sample: vocabulary of {V}; 1 to {MAX_VOCAB} tokens supported")
    if scratch is None:
        scratch = _default_scratch(B, V)
    launch_adjust(logits, slots, positions, table, token_ids, scratch, THREADS, stream)
    _argmax_parts_kernel[(B, PARTS), PART_THREADS, stream](
        logits,
        slots,
        positions,
        table.presence_penalty,
        table.frequency_penalty,
        table.repetition_penalty,
        table.min_tokens,
        table.prompt_len,
        table.num_bias,
        table.num_min_stop_ids,
        token_ids,
        scratch.values,
        scratch.part_max,
        scratch.part_id,
    )
    _sample_kernel[B, THREADS, stream](
        logits,
        slots,
        positions,
        table.temperature,
        table.seed,
        table.top_k,
        table.top_p,
        table.min_p,
        table.presence_penalty,
        table.frequency_penalty,
        table.repetition_penalty,
        table.min_tokens,
        table.prompt_len,
        table.num_bias,
        table.num_min_stop_ids,
        token_ids,
        num_tokens,
        scratch.values,
        scratch.part_max,
        scratch.part_id,
        out_tokens,
    )
    if out_logprobs is not None:
        launch_sample_logprobs(logits, slots, table.num_logprobs, out_tokens, out_logprobs, stream)
