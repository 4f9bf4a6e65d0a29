"""Token sampler on the GPU: greedy and seeded temperature sampling. Hot path: keep it lean.

One block per row, writing the token into out_tokens and the device mirror (token_ids[slot,
position], num_tokens[slot]) as kernels/cpu/sampling.py does, so sampled ids never leave the
device until the host wants them.
  greedy (temperature < GREEDY_EPS): argmax of the logits, ties to the lowest id;
  temperature: e_i = exp((x_i - max) / T) in float64 (0 at or below EXP_CUTOFF), the CPU's
      uniform u = splitmix64(seed, position), and the first id, in vocabulary order, whose
      running sum of e exceeds u * sum(e) (fallback: the last id with e > 0). The vocabulary is
      cut into one contiguous chunk per thread; chunk sums are added in chunk order and only
      the chunk holding the crossing is walked, by its thread. Sums run in another order than
      the CPU's 8 lanes, so a token can differ only where u * sum(e) sits within float64
      rounding of a boundary.
Not yet: logit bias, min_tokens stop masks, repetition / frequency / presence penalties, top_k,
top_p, min_p and logprobs. A row whose slot asks for any of the first seven gets token
UNSUPPORTED (-2) and leaves the mirror alone, so a caller that routes it here by mistake sees
it at once instead of sampling from the wrong distribution.
"""

import math

import numpy as np
from numba import cuda, float32, float64, int32

from vtllm.kernels.cuda._device import MAX_WARPS, NEG_INF, SIMULATOR, block_argmax, imin, uniform
from vtllm.kernels.cuda._host import check
from vtllm.kernels.sampling_table import EXP_CUTOFF, GREEDY_EPS, TABLE_LAYOUT, SamplingTable

__all__ = ["UNSUPPORTED", "device_table", "sample"]

THREADS = 32 if SIMULATOR else 256
MAX_THREADS = 1024
UNSUPPORTED = -2


@cuda.jit(device=True)
def _e(x, m, inv_t):
    """Unnormalized probability of logit x: exp((x - m) / T), 0 at or below EXP_CUTOFF."""
    s = (np.float64(x) - m) * inv_t
    return math.exp(s) if s > EXP_CUTOFF else 0.0


@cuda.jit(device=True)
def _unsupported(s, pos, V, top_k, top_p, min_p, presence, frequency, repetition, min_tokens,
                 prompt_len, num_bias, num_min_stop):  # fmt: skip
    if 0 < top_k[s] < V or top_p[s] < 1.0 or min_p[s] > 0.0 or num_bias[s] > 0:
        return True
    if presence[s] != 0.0 or frequency[s] != 0.0 or repetition[s] != 1.0:
        return True
    out_start = imin(prompt_len[s] if prompt_len[s] > 0 else 0, pos)
    return pos - out_start < min_tokens[s] and num_min_stop[s] > 0


@cuda.jit(cache=True)
def _sample_kernel(logits, slots, positions, temperature, seed, top_k, top_p, min_p, presence,
                   frequency, repetition, min_tokens, prompt_len, num_bias, num_min_stop,
                   token_ids, num_tokens, out_tokens):  # fmt: skip
    b, tid, nt = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    V = logits.shape[1]
    s, pos = slots[b], positions[b]
    if s < 0 or s >= token_ids.shape[0] or pos < 0 or pos >= token_ids.shape[1]:
        if tid == 0:  # padding (slot -1), or out of range: token -1, mirror untouched
            out_tokens[b] = -1
        return
    if _unsupported(s, pos, V, top_k, top_p, min_p, presence, frequency, repetition,
                    min_tokens, prompt_len, num_bias, num_min_stop):  # fmt: skip
        if tid == 0:
            out_tokens[b] = UNSUPPORTED
        return
    sv = cuda.shared.array(MAX_WARPS, float32)
    si = cuda.shared.array(MAX_WARPS, int32)
    sums = cuda.shared.array(MAX_THREADS, float64)
    pick = cuda.shared.array(1, int32)
    pick_f = cuda.shared.array(2, float64)
    best, bi = NEG_INF, np.int32(V)
    for i in range(tid, V, nt):  # increasing i: '>' keeps this thread's lowest tie
        x = logits[b, i]
        if x > best:
            best, bi = x, np.int32(i)
    best, bi = block_argmax(best, bi, sv, si)
    t = np.float64(temperature[s])
    if t < GREEDY_EPS or bi >= V:  # greedy, or no finite logit (the CPU gives 0 then)
        if tid == 0:
            tok = bi if bi < V else 0
            out_tokens[b] = tok
            token_ids[s, pos] = tok
            num_tokens[s] = pos + 1
        return
    m, inv_t = np.float64(best), 1.0 / t
    chunk = (V + nt - 1) // nt
    lo, hi = imin(V, tid * chunk), imin(V, tid * chunk + chunk)
    acc = 0.0
    for i in range(lo, hi):
        acc += _e(logits[b, i], m, inv_t)
    sums[tid] = acc
    cuda.syncthreads()
    if tid == 0:
        z = 0.0
        for c in range(nt):
            z += sums[c]
        target = uniform(seed[s], pos) * z
        run, found, last, last_start = 0.0, -1, 0, 0.0
        start = 0.0
        for c in range(nt):
            if sums[c] > 0.0:
                last, last_start = c, run
            if found < 0 and run + sums[c] > target:
                found, start = c, run
            run += sums[c]
        if found < 0:  # u * z rounded up to z: take the last token with e > 0
            found, start = last, last_start
        pick[0] = found
        pick_f[0] = start
        pick_f[1] = target
    cuda.syncthreads()
    if tid == pick[0]:
        run, target, tok = pick_f[0], pick_f[1], lo
        for i in range(lo, hi):
            e = _e(logits[b, i], m, inv_t)
            run += e
            if e > 0.0:
                tok = i
                if run > target:
                    break
        out_tokens[b] = tok
        token_ids[s, pos] = tok
        num_tokens[s] = pos + 1


_FIELDS = ("temperature", "seed", "top_k", "top_p", "min_p", "presence_penalty",
           "frequency_penalty", "repetition_penalty", "min_tokens", "prompt_len", "num_bias",
           "num_min_stop_ids")  # fmt: skip


def device_table(table: SamplingTable, *, stream=0) -> SamplingTable:
    """A SamplingTable whose arrays are device copies of table's (what sample() reads)."""
    return SamplingTable(
        **{name: cuda.to_device(getattr(table, name), stream=stream) for name in TABLE_LAYOUT}
    )


def sample(
    logits, slots, positions, table: SamplingTable, token_ids, num_tokens, out_tokens, *, stream=0
) -> None:
    """Sample one token per row into out_tokens and the mirror: token_ids[slot, position] and
    num_tokens[slot] = position + 1. Rows with slot -1 are padding (token -1, nothing written);
    so are rows whose slot or position is out of range (the launcher cannot see device values).

    logits [B, V] float32 (read only); slots, positions, out_tokens [B] int32; token_ids
    [max_slots, max_len] int32; num_tokens [max_slots] int32; table: a SamplingTable of device
    arrays (device_table). A slot may appear once per call. Rows needing features this sampler
    lacks get UNSUPPORTED (see the module docstring)."""
    check("sample", "logits", logits, np.float32, 2)
    B = logits.shape[0]
    for name, a in (("slots", slots), ("positions", positions), ("out_tokens", out_tokens)):
        check("sample", name, a, np.int32, 1, (B,))
    check("sample", "token_ids", token_ids, np.int32, 2)
    S = token_ids.shape[0]
    check("sample", "num_tokens", num_tokens, np.int32, 1, (S,))
    fields = []
    for name in _FIELDS:
        dtype, _ = TABLE_LAYOUT[name]
        a = getattr(table, name)
        check("sample", f"table.{name}", a, dtype, 1, (S,))
        fields.append(a)
    if B == 0:
        return
    if logits.shape[1] == 0:
        raise ValueError("sample: empty vocabulary")
    _sample_kernel[B, THREADS, stream](
        logits, slots, positions, *fields, token_ids, num_tokens, out_tokens
    )
