"""Logit adjustments before the GPU sampler draws, in the CPU sampler's order and float64
arithmetic (kernels/cpu/sampling._adjust): logit bias, min_tokens stop masks, then repetition
penalty over prompt + output and frequency / presence penalties over the output, both read from
the device mirror token_ids[slot, :position] (the output starts at prompt_len).

Only rows that ask for one of them are touched: such a row's float64 logits go to
scratch.values[b] and get adjusted there; the sampler reads them from there (adjusted()).
Penalties count tokens in scratch.counts[b], which is all zeros between calls: the first
thread to claim a token (atomic exchange back to 0) applies its penalty and leaves the zero.

apply_token_masks runs before all of that, on the logits themselves: a constrained request's
packed mask (structured outputs, allowed ids, bad words) sets the tokens it forbids to -inf,
so the sampler and the logprobs see the masked distribution, as on the CPU.
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR, imin
from vtllm.kernels.cuda._host import check
from vtllm.kernels.cuda._ptx import grid_dependency_sync

_SEEN = np.int32(1 << 30)  # flag: the token occurs in the history; low bits count the output


@cuda.jit(device=True)
def adjusted(
    s, pos, presence, frequency, repetition, min_tokens, prompt_len, num_bias, num_min_stop
):
    """Whether slot s at position pos needs any adjustment (the same answer in both kernels)."""
    if num_bias[s] > 0 or presence[s] != 0.0 or frequency[s] != 0.0 or repetition[s] != 1.0:
        return True
    return pos - out_start(s, pos, prompt_len) < min_tokens[s] and num_min_stop[s] > 0


@cuda.jit(device=True)
def out_start(s, pos, prompt_len):
    p = prompt_len[s]
    return imin(p if p > 0 else 0, pos)


@cuda.jit(cache=True)
def _adjust_kernel(
    logits,
    slots,
    positions,
    presence,
    frequency,
    repetition,
    min_tokens,
    prompt_len,
    bias_ids,
    bias_values,
    num_bias,
    min_stop_ids,
    num_min_stop,
    token_ids,
    values,
    counts,
):
    grid_dependency_sync()
    b, tid, nt = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    V = logits.shape[1]
    s, pos = slots[b], positions[b]
    if s < 0 or s >= token_ids.shape[0] or pos < 0 or pos >= token_ids.shape[1]:
        return
    if not adjusted(
        s, pos, presence, frequency, repetition, min_tokens, prompt_len, num_bias, num_min_stop
    ):
        return
    for i in range(tid, V, nt):
        values[b, i] = np.float64(logits[b, i])
    cuda.syncthreads()
    n = imin(num_bias[s], bias_ids.shape[1])
    for j in range(tid, n, nt):  # a repeated id is summed in table order by its first entry
        t = bias_ids[s, j]
        first = 0 <= t < V
        for k in range(j):
            if bias_ids[s, k] == t:
                first = False
        if first:
            w = values[b, t]
            for k in range(j, n):
                if bias_ids[s, k] == t:
                    w += np.float64(bias_values[s, k])
            values[b, t] = w
    cuda.syncthreads()
    start = out_start(s, pos, prompt_len)
    if pos - start < min_tokens[s]:
        for j in range(tid, imin(num_min_stop[s], min_stop_ids.shape[1]), nt):
            t = min_stop_ids[s, j]
            if 0 <= t < V:
                values[b, t] = -np.inf
    cuda.syncthreads()
    r, f, p = np.float64(repetition[s]), np.float64(frequency[s]), np.float64(presence[s])
    if r == 1.0 and f == 0.0 and p == 0.0:
        return
    for i in range(tid, pos, nt):
        t = token_ids[s, i]
        if 0 <= t < V:
            cuda.atomic.or_(counts, (b, t), _SEEN)
            if i >= start:
                cuda.atomic.add(counts, (b, t), np.int32(1))
    cuda.syncthreads()
    for i in range(tid, pos, nt):
        t = token_ids[s, i]
        if 0 <= t < V:
            old = cuda.atomic.exch(counts, (b, t), np.int32(0))
            if old & _SEEN:  # the first claim: apply once, as the CPU's distinct-token loop
                w = values[b, t]
                if r != 1.0:
                    w = w / r if w > 0.0 else w * r
                c = old & (_SEEN - 1)
                if (f != 0.0 or p != 0.0) and c > 0:
                    w = w - f * np.float64(c) - p
                values[b, t] = w


def launch_adjust(logits, slots, positions, table, token_ids, scratch, threads, stream) -> None:
    _adjust_kernel[logits.shape[0], threads, stream](
        logits,
        slots,
        positions,
        table.presence_penalty,
        table.frequency_penalty,
        table.repetition_penalty,
        table.min_tokens,
        table.prompt_len,
        table.bias_ids,
        table.bias_values,
        table.num_bias,
        table.min_stop_ids,
        table.num_min_stop_ids,
        token_ids,
        scratch.values,
        scratch.counts,
    )


MASK_THREADS = 32 if SIMULATOR else 256
MASK_BLOCKS = 2 if SIMULATOR else 64  # per row; a grid-stride loop covers the rest


@cuda.jit(cache=True)
def _token_mask_kernel(logits, bits, mask_rows):
    grid_dependency_sync()
    b = cuda.blockIdx.y
    r = mask_rows[b]
    if r < 0 or r >= bits.shape[0]:
        return  # an unconstrained row (or padding): the common case costs one read
    V, W = logits.shape[1], bits.shape[1]
    step = cuda.gridDim.x * cuda.blockDim.x
    for t in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, V, step):
        w = t >> 5
        if w >= W or (bits[r, w] >> (t & 31)) & 1 == 0:
            logits[b, t] = -np.inf


def apply_token_masks(logits, bits, mask_rows, *, stream=0) -> None:
    """Constrained decoding: logits[b, t] = -inf unless bit t of bits[mask_rows[b]] is set
    (bit t % 32 of int32 word t // 32; tokens past the mask's width are masked too). Rows with
    mask_rows[b] < 0 are left as they are. logits [B, V] float32 in place; bits [M, W] int32;
    mask_rows [B] int32 (device values: out-of-range rows count as unmasked)."""
    check("apply_token_masks", "logits", logits, np.float32, 2)
    check("apply_token_masks", "bits", bits, np.int32, 2)
    B = logits.shape[0]
    check("apply_token_masks", "mask_rows", mask_rows, np.int32, 1, (B,))
    if B:
        _token_mask_kernel[(MASK_BLOCKS, B), MASK_THREADS, stream](logits, bits, mask_rows)
