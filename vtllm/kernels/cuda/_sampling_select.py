"""Where the GPU sampler's filters cut a row, without sorting it: the k-th token, or the token
at which the running probability mass reaches a target, in the CPU sampler's order (descending
e, ties by lower id; kernels/cpu/sampling.py).

A radix descent over the bits of e (float64 in (0, 1], kept in scratch by the caller): level 0
bins the candidates by exponent (1024 octaves), levels 1-5 by 10 mantissa bits each and level 6
by the last 2, each time inside the bin chosen above. The descent stops early once the chosen
bin holds one token (usually after a level or two). Bins count tokens and sum their 53-bit
mantissas exactly in two int64 words (the high 29 bits; the count above the low 24 bits' sum:
two atomics a token), so atomics in any order give the same bits: the cut and the draw are
deterministic run to run. After level 6 the chosen bin is one exact value; its
ties are taken by lower id with one ordered pass over the row, as the CPU's walk does.

Every function here holds barriers: call it from block-uniform control flow only.
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR, imin

NBINS = 1024  # 10-bit digits: the exponent of e <= 1 fits in 10 bits
LEVELS = 7  # 10 exponent bits + 5 x 10 + 2 mantissa bits = the 62 bits of a positive e <= 1
COUNT, AT_LEAST, ABOVE = 0, 1, 2  # cut at cumulative count >= k, mass >= target, mass > target
# The low halves' sum stays under 2^43 and the count (up to 2^19) fits above it, below the
# sign: Gemma 3's 262,208 tokens are past 2^18. The split does not change a bin's mass: both
# halves are exact in float64, so hi * 2^24 + lo is the sum's one correct rounding either way.
MAX_VOCAB = 1 << 19
_MANT = (1 << 52) - 1
_IMPLICIT = 1 << 52
_LOW_BITS = 24
_LOW = (1 << _LOW_BITS) - 1
_SUM = (1 << 43) - 1  # the low halves' sum in the packed word
_ONE = 1 << 43  # one token in the packed count

if SIMULATOR:

    @cuda.jit(device=True)
    def f64_bits(x):
        return np.float64(x).view(np.int64)

    @cuda.jit(device=True)
    def bits_f64(k):
        return np.int64(k).view(np.float64)

else:

    @cuda.jit(device=True)
    def f64_bits(x):
        return cuda.libdevice.double_as_longlong(x)

    @cuda.jit(device=True)
    def bits_f64(k):
        return cuda.libdevice.longlong_as_double(k)


@cuda.jit(device=True)
def _bin_mass(hi, lo, exponent):
    """Sum of the bin's e values: (hi * 2^24 + lo) * 2^(exponent - 1075), scaled in two exact
    power-of-two steps so no intermediate leaves the normal range."""
    s = np.float64(hi) * 16777216.0 + np.float64(lo)
    return s * bits_f64(np.int64(423) << 52) * bits_f64(np.int64(exponent + 548) << 52)


@cuda.jit(device=True)
def _count(hl, j):
    return hl[j] >> 43


@cuda.jit(device=True)
def _mass(hh, hl, j, exponent):
    return _bin_mass(hh[j], hl[j] & _SUM, exponent)


@cuda.jit(device=True)
def _crosses(mode, c, m, target_c, target_m):
    if mode == COUNT:
        return c >= target_c
    if mode == AT_LEAST:
        return m >= target_m
    return m > target_m


@cuda.jit(device=True)
def _in_set(key, i, set_key, set_id):
    """Tokens kept by the previous cut: e above its value, or equal with an id up to its id."""
    return key > 0 and (key > set_key or (key == set_key and i <= set_id))


@cuda.jit(device=True)
def _tie_count(mode, n, above_c, above_m, ev, target_c, target_m):
    """How many of the n tied tokens (each of mass ev) the cut takes, at least 1."""
    if mode == COUNT:
        j = target_c - above_c
    else:
        q = (target_m - above_m) / ev
        j = np.int64(n) if q >= n else (np.int64(q) if q > 0.0 else np.int64(0))
        while j < n and not _crosses(mode, 0, above_m + np.float64(j) * ev, 0, target_m):
            j += 1
        while j > 1 and _crosses(mode, 0, above_m + np.float64(j - 1) * ev, 0, target_m):
            j -= 1
    return j if j > 1 else np.int64(1)


@cuda.jit(device=True)
def select(e, b, mode, target_c, target_m, set_key, set_id, hh, hl, tc, tm, ri, rf):
    """The cut in row b of e among the tokens of the previous cut (set_key, set_id; (0, -1)
    for every token with e > 0): returns (e bits of the cut token, its id, mass through it).
    When rounding keeps the target out of reach the last kept token is the cut (the CPU's
    fallback). Shared: hh / hl int64 [NBINS], tc int32 / tm float64
    [threads], ri int64 [8], rf float64 [4]."""
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = e.shape[1]
    prefix, shift, exponent = np.int64(0), 62, np.int64(0)
    above_c, above_m, n = np.int64(0), 0.0, np.int64(0)
    for level in range(LEVELS):
        width = 10 if level < LEVELS - 1 else 2
        top, shift = shift, shift - width
        nb = 1 << width
        for j in range(tid, nb, nt):
            hh[j], hl[j] = 0, 0
        if tid == 0:
            ri[0], ri[1] = nb, -1
        cuda.syncthreads()
        for i in range(tid, V, nt):
            key = f64_bits(e[b, i])
            if _in_set(key, i, set_key, set_id) and (key >> top) == prefix:
                bn = nb - 1 - ((key >> shift) & (nb - 1))
                mant = (key & _MANT) | _IMPLICIT
                cuda.atomic.add(hh, bn, mant >> _LOW_BITS)
                cuda.atomic.add(hl, bn, _ONE + (mant & _LOW))
        cuda.syncthreads()
        cb = (nb + nt - 1) // nt  # each thread scans a contiguous run of bins
        lo, hi = imin(nb, tid * cb), imin(nb, tid * cb + cb)
        c, m = np.int32(0), 0.0
        for j in range(lo, hi):
            c += _count(hl, j)
            m += _mass(hh, hl, j, 1023 - j if level == 0 else exponent)
        tc[tid], tm[tid] = c, m
        cuda.syncthreads()
        pc, pm = above_c, above_m
        for t in range(tid):  # the same fixed order in every thread: deterministic
            pc += tc[t]
            pm += tm[t]
        first, last, c0, m0 = nb, -1, pc, pm
        for j in range(lo, hi):
            if _count(hl, j) > 0:
                last = j
                pc += _count(hl, j)
                pm += _mass(hh, hl, j, 1023 - j if level == 0 else exponent)
                if first == nb and _crosses(mode, pc, pm, target_c, target_m):
                    first = j
        if first < nb:
            cuda.atomic.min(ri, 0, first)
        if last >= 0:
            cuda.atomic.max(ri, 1, last)
        cuda.syncthreads()
        chosen = ri[0] if ri[0] < nb else ri[1]  # no crossing: the last non-empty bin
        if lo <= chosen < hi:
            for j in range(lo, chosen):
                if _count(hl, j) > 0:
                    c0 += _count(hl, j)
                    m0 += _mass(hh, hl, j, 1023 - j if level == 0 else exponent)
            ri[2], ri[3], rf[0] = c0, _count(hl, chosen), m0
        cuda.syncthreads()
        above_c, n, above_m = ri[2], ri[3], rf[0]
        digit = nb - 1 - chosen
        if level == 0:
            exponent = digit
        prefix = (prefix << width) | digit
        if n <= 1:
            break
    return _find(
        e,
        b,
        mode,
        target_c,
        target_m,
        set_key,
        set_id,
        prefix,
        shift,
        n,
        above_c,
        above_m,
        tc,
        ri,
        rf,
    )


@cuda.jit(device=True)
def _find(
    e, b, mode, target_c, target_m, set_key, set_id, prefix, shift, n, above_c, above_m, tc, ri, rf
):
    """The j-th token by id among the candidates left in the chosen bin (n of them; when
    n > 1 they all hold the same value)."""
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    V = e.shape[1]
    j = np.int64(1)
    if n > 1:
        j = imin(_tie_count(mode, n, above_c, above_m, bits_f64(prefix), target_c, target_m), n)
        chunk = (V + nt - 1) // nt  # contiguous ids per thread: the j-th needs an id order
        lo, hi = imin(V, tid * chunk), imin(V, tid * chunk + chunk)
        c = np.int32(0)
        for i in range(lo, hi):
            key = f64_bits(e[b, i])
            if _in_set(key, i, set_key, set_id) and (key >> shift) == prefix:
                c += 1
        tc[tid] = c
        cuda.syncthreads()
        before = np.int64(0)
        for t in range(tid):
            before += tc[t]
        if before < j <= before + c:
            for i in range(lo, hi):
                key = f64_bits(e[b, i])
                if _in_set(key, i, set_key, set_id) and (key >> shift) == prefix:
                    before += 1
                    if before == j:
                        ri[4], ri[5], rf[1] = i, key, e[b, i]
                        break
    else:
        for i in range(tid, V, nt):
            key = f64_bits(e[b, i])
            if _in_set(key, i, set_key, set_id) and (key >> shift) == prefix:
                ri[4], ri[5], rf[1] = i, key, e[b, i]
    cuda.syncthreads()
    return ri[5], ri[4], above_m + np.float64(j) * rf[1]
