"""Device helpers the CUDA kernels share: f16/bf16 bits to float32, weight decoding for every
QType, warp and block reductions, and the sampler's counter-based uniform.

numba's simulator (NUMBA_ENABLE_CUDASIM=1) has no libdevice and no warp shuffles, so the
helpers that need them get a pure-Python stand-in there, chosen at import. The stand-in
reductions exchange values through a module-level list between two barriers (the simulator
runs one block at a time), so every thread of a block must call them the same number of times:
the kernels keep their reductions in block-uniform control flow, which the GPU code needs
anyway for its own barriers.

Over 400 lines: each helper is written twice, the simulator's stand-in and the device code,
side by side under one SIMULATOR switch so that the two read (and change) together.
"""

import numpy as np
from numba import cuda
from numba.core import config

from vtllm.kernels import QType

SIMULATOR = bool(config.ENABLE_CUDASIM)

F32, F16, Q4_0, Q4_1, Q8_0, BF16 = (
    int(q) for q in (QType.F32, QType.F16, QType.Q4_0, QType.Q4_1, QType.Q8_0, QType.BF16)
)
QK = 32
BB_Q4_0, BB_Q4_1, BB_Q8_0 = 18, 20, 34
FULL_MASK = 0xFFFFFFFF
MAX_WARPS = 32  # 1024 threads
_F16_SUBNORMAL = np.float32(2.0**-24)
NEG_INF = np.float32(-np.inf)


@cuda.jit(device=True)
def imin(a, b):
    """min / max for device code: numba 0.68's built-in CUDA target fails to compile the
    builtins' star-args overloads ("Signature mismatch")."""
    return a if a < b else b


@cuda.jit(device=True)
def fmax(a, b):
    return a if a > b else b


if SIMULATOR:
    from numba.cuda.simulator.kernel import _get_kernel_context as _sim

    # The stand-ins reach the simulated block through _sim(), never through this module's
    # `cuda` global: the simulator swaps a device function's module globals on every call, and
    # its threads run concurrently, so a global swapped back by one thread breaks another.
    _lanes = [None] * 1024  # the block's exchange buffer; see the module docstring

    def _patch_simulator_shared_arrays():
        """numba's simulator makes a block's cuda.shared.array on first use with an unlocked
        get-then-set, so two threads arriving together may each get their own (uninitialised)
        array, and the block's exchange through it reads garbage now and then. Same lookup,
        under a lock."""
        import sys
        import threading
        import traceback

        from numba.core import types
        from numba.cuda.simulator.kernelapi import FakeCUDAShared
        from numba.np import numpy_support

        lock, unlocked = threading.Lock(), FakeCUDAShared.array

        def array(self, shape, dtype):
            if shape == 0:  # dynamic shared memory: one buffer, no lookup
                return unlocked(self, shape, dtype)
            if isinstance(dtype, types.Type):
                dtype = numpy_support.as_dtype(dtype)
            caller = traceback.extract_stack(sys._getframe())[-2][0:2]  # as numba keys it
            with lock:
                res = self._allocations.get(caller)
                if res is None:
                    res = self._allocations[caller] = np.empty(shape, dtype)
            return res

        FakeCUDAShared.array = array

    def _patch_simulator_device_calls():
        """numba's simulator swaps the `cuda` global of a device function's module for the
        fake module on every call and back on return, unlocked: when a kernel calls a device
        function of another module, one thread's return puts the real module back while other
        threads still run inside it. Same swap, counted under a lock: the first thread in
        swaps, the last one out restores."""
        import threading
        from contextlib import contextmanager

        from numba.cuda.simulator import kernel

        lock, inside = threading.Lock(), {}  # id(globals) -> [threads inside, originals]
        real = cuda  # this module's own `cuda` global is swapped too while a kernel runs

        @contextmanager
        def swapped_cuda_module(fn, fake_cuda_module):
            globs, key = fn.__globals__, id(fn.__globals__)
            with lock:
                entry = inside.get(key)
                if entry is None:
                    orig = {k: v for k, v in globs.items() if v is real}
                    globs.update(dict.fromkeys(orig, fake_cuda_module))
                    entry = inside[key] = [0, orig]
                entry[0] += 1
            try:
                yield
            finally:
                with lock:
                    entry[0] -= 1
                    if entry[0] == 0:
                        globs.update(entry[1])
                        del inside[key]

        kernel.swapped_cuda_module = swapped_cuda_module

    _patch_simulator_shared_arrays()
    _patch_simulator_device_calls()

    @cuda.jit(device=True)
    def as_f32(bits):
        """float32 whose bit pattern is the low 32 bits of the integer bits."""
        return np.uint32(int(bits) & 0xFFFFFFFF).view(np.float32)

    @cuda.jit(device=True)
    def f32_bits(x):
        """The bit pattern of float32 x, as a non-negative integer (as_f32's inverse)."""
        return np.int64(np.float32(x).view(np.uint32))

    @cuda.jit(device=True)
    def fma32(a, b, c):
        """a * b + c through float64 (the product exact, the sum rounded there, then to
        float32): the simulator's paths only need to agree with one another."""
        return np.float32(np.float64(a) * np.float64(b) + np.float64(c))

    def _exchange(v):
        """Publishes v as this thread's lane; returns (thread index, threads in the block)."""
        ctx = _sim()
        tid = ctx.threadIdx.x
        ctx.syncthreads()  # everyone has read the previous exchange
        _lanes[tid] = v
        ctx.syncthreads()
        return tid, ctx.blockDim.x

    @cuda.jit(device=True)
    def sync_warp():
        """The simulator has no warp barrier: a block barrier stands in (so every thread of
        the block must call it the same number of times)."""
        _sim().syncthreads()

    @cuda.jit(device=True)
    def warp_sum(v):
        tid, nt = _exchange(v)
        base = tid - tid % 32
        r = _lanes[base]
        for i in range(base + 1, min(base + 32, nt)):
            r += _lanes[i]
        return r

    @cuda.jit(device=True)
    def lane_xor16(v):
        tid, _ = _exchange(v)
        return _lanes[tid ^ 16]

    @cuda.jit(device=True)
    def lane_value(v, src):
        tid, _ = _exchange(v)
        return _lanes[tid - tid % 32 + src]

    @cuda.jit(device=True)
    def warp_max(v):
        tid, nt = _exchange(v)
        base = tid - tid % 32
        r = _lanes[base]
        for i in range(base + 1, min(base + 32, nt)):
            r = max(r, _lanes[i])
        return r

    @cuda.jit(device=True)
    def warp_sum4(a, b, c, d):
        tid, nt = _exchange((a, b, c, d))
        base = tid - tid % 32
        r0, r1, r2, r3 = _lanes[base]
        for i in range(base + 1, min(base + 32, nt)):
            e = _lanes[i]
            r0, r1, r2, r3 = r0 + e[0], r1 + e[1], r2 + e[2], r3 + e[3]
        return r0, r1, r2, r3

    def _quad(v):
        tid, _ = _exchange(v)
        q = tid - tid % 4
        return _lanes[q], _lanes[q + 1], _lanes[q + 2], _lanes[q + 3]

    @cuda.jit(device=True)
    def quad_max(v):
        a, b, c, d = _quad(v)
        return max(max(a, b), max(c, d))

    @cuda.jit(device=True)
    def quad_sum(v):
        a, b, c, d = _quad(v)
        return np.float32(np.float32(a + b) + np.float32(c + d))

    @cuda.jit(device=True)
    def octet_max4(a, b, c, d):
        tid, _ = _exchange((a, b, c, d))
        base = tid - tid % 8
        r = _lanes[base][0]
        for i in range(1, 32):
            r = max(r, _lanes[base + i % 8][i // 8])
        return r

    @cuda.jit(device=True)
    def octet_sum4(a, b, c, d):
        tid, _ = _exchange((a, b, c, d))
        base = tid - tid % 8
        r = _lanes[base][0]
        for i in range(1, 32):  # warp_sum's order here: item by item
            r += _lanes[base + i % 8][i // 8]
        return r

    @cuda.jit(device=True)
    def block_sum(v, scratch):
        """The GPU's shape of sum: each warp's, then the warps' in order."""
        _, nt = _exchange(v)
        r = np.float32(0.0)
        for base in range(0, nt, 32):
            part = _lanes[base]
            for i in range(base + 1, min(base + 32, nt)):
                part += _lanes[i]
            r = part if base == 0 else r + part
        return r

    @cuda.jit(device=True)
    def block_max(v, scratch):
        _, nt = _exchange(v)
        r = _lanes[0]
        for i in range(1, nt):
            r = max(r, _lanes[i])
        return r

    @cuda.jit(device=True)
    def block_argmax(v, i, scratch_v, scratch_i):
        """(max, its lowest index) over the block's (v, i) pairs."""
        _, nt = _exchange((v, i))
        bv, bi = _lanes[0]
        for t in range(1, nt):
            ov, oi = _lanes[t]
            if ov > bv or (ov == bv and oi < bi):
                bv, bi = ov, oi
        return bv, bi

    def _mix64_py(z):
        m = (1 << 64) - 1
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    @cuda.jit(device=True)
    def uniform(seed, position):
        """Same as kernels/cpu/sampling._uniform, in Python ints."""
        m = (1 << 64) - 1
        z = _mix64_py((int(seed) + _mix64_py((int(position) + 0x9E3779B97F4A7C15) & m)) & m)
        return (z >> 11) * 2.0**-53

else:

    @cuda.jit(device=True)
    def as_f32(bits):
        """float32 whose bit pattern is the low 32 bits of the integer bits."""
        return cuda.libdevice.int_as_float(np.int32(bits))

    @cuda.jit(device=True)
    def f32_bits(x):
        """The bit pattern of float32 x, as a non-negative integer (as_f32's inverse)."""
        return np.int64(cuda.libdevice.float_as_int(np.float32(x))) & 0xFFFFFFFF

    @cuda.jit(device=True)
    def fma32(a, b, c):
        """a * b + c rounded once. Where a sum of two products must give the same bits in two
        kernels, write it with this: the compiler fuses one of the products into the sum, and
        which one it picks depends on the code around it."""
        return cuda.libdevice.fmaf(a, b, c)

    @cuda.jit(device=True)
    def sync_warp():
        """Barrier of the warp's lanes, with memory ordering among them (bar.warp.sync)."""
        cuda.syncwarp(FULL_MASK)

    @cuda.jit(device=True)
    def warp_sum(v):
        v += cuda.shfl_xor_sync(FULL_MASK, v, 16)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 8)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 4)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
        return v

    @cuda.jit(device=True)
    def warp_sum4(a, b, c, d):
        return warp_sum(a), warp_sum(b), warp_sum(c), warp_sum(d)

    @cuda.jit(device=True)
    def octet_max4(a, b, c, d):
        """The max of 32 items held four a lane by eight consecutive lanes (item k + 8 u in
        slot u of lane k of the eight), for each of the eight lanes: warp_max's result had
        item i been lane i's. Every lane of the warp calls it."""
        v = fmax(fmax(a, b), fmax(c, d))
        v = fmax(v, cuda.shfl_xor_sync(FULL_MASK, v, 4))
        v = fmax(v, cuda.shfl_xor_sync(FULL_MASK, v, 2))
        return fmax(v, cuda.shfl_xor_sync(FULL_MASK, v, 1))

    @cuda.jit(device=True)
    def octet_sum4(a, b, c, d):
        """The sum of 32 items laid out as for octet_max4, with warp_sum's bits: its lanes 16
        and 8 apart hold items 16 and 8 apart, here slots u ^ 2 and u ^ 1 of one lane, and its
        last three steps pair the same items across the eight lanes (a + b == b + a in
        float32, so which of a pair adds which does not matter)."""
        v = (a + c) + (b + d)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 4)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 2)
        v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
        return v

    @cuda.jit(device=True)
    def quad_max(v):
        """The max over the four lanes 4 g .. 4 g + 3 of v, for each of them (every lane of
        the warp calls it): an mma accumulator row's (_ptx.mma_bf16)."""
        v = fmax(v, cuda.shfl_xor_sync(FULL_MASK, v, 1))
        return fmax(v, cuda.shfl_xor_sync(FULL_MASK, v, 2))

    @cuda.jit(device=True)
    def quad_sum(v):
        """The sum as quad_max, (v0 + v1) + (v2 + v3) in each lane."""
        v += cuda.shfl_xor_sync(FULL_MASK, v, 1)
        return v + cuda.shfl_xor_sync(FULL_MASK, v, 2)

    @cuda.jit(device=True)
    def lane_xor16(v):
        """v of the lane 16 away in this warp (every lane calls it)."""
        return cuda.shfl_xor_sync(FULL_MASK, v, 16)

    @cuda.jit(device=True)
    def lane_value(v, src):
        """v of lane src (0 .. 31, its own for each lane) of this warp (every lane calls it)."""
        return cuda.shfl_sync(FULL_MASK, v, src)

    @cuda.jit(device=True)
    def warp_max(v):
        v = fmax(v, cuda.shfl_xor_sync(FULL_MASK, v, 16))
        v = fmax(v, cuda.shfl_xor_sync(FULL_MASK, v, 8))
        v = fmax(v, cuda.shfl_xor_sync(FULL_MASK, v, 4))
        v = fmax(v, cuda.shfl_xor_sync(FULL_MASK, v, 2))
        v = fmax(v, cuda.shfl_xor_sync(FULL_MASK, v, 1))
        return v

    @cuda.jit(device=True)
    def block_sum(v, scratch):
        """Sum over the block, the same value in every thread; scratch: shared [MAX_WARPS]."""
        v = warp_sum(v)
        lane, wid = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
        cuda.syncthreads()  # the previous reduction's readers are done with scratch
        if lane == 0:
            scratch[wid] = v
        cuda.syncthreads()
        r = scratch[0]
        for i in range(1, (cuda.blockDim.x + 31) // 32):
            r += scratch[i]
        return r

    @cuda.jit(device=True)
    def block_max(v, scratch):
        v = warp_max(v)
        lane, wid = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
        cuda.syncthreads()
        if lane == 0:
            scratch[wid] = v
        cuda.syncthreads()
        r = scratch[0]
        for i in range(1, (cuda.blockDim.x + 31) // 32):
            r = fmax(r, scratch[i])
        return r

    @cuda.jit(device=True)
    def block_argmax(v, i, scratch_v, scratch_i):
        """(max, its lowest index) over the block's (v, i) pairs."""
        for off in (16, 8, 4, 2, 1):
            ov = cuda.shfl_xor_sync(FULL_MASK, v, off)
            oi = cuda.shfl_xor_sync(FULL_MASK, i, off)
            if ov > v or (ov == v and oi < i):
                v, i = ov, oi
        lane, wid = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
        cuda.syncthreads()
        if lane == 0:
            scratch_v[wid], scratch_i[wid] = v, i
        cuda.syncthreads()
        bv, bi = scratch_v[0], scratch_i[0]
        for t in range(1, (cuda.blockDim.x + 31) // 32):
            ov, oi = scratch_v[t], scratch_i[t]
            if ov > bv or (ov == bv and oi < bi):
                bv, bi = ov, oi
        return bv, bi

    _M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    _GOLDEN = np.uint64(0x9E3779B97F4A7C15)
    _S11, _S27, _S30, _S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)

    @cuda.jit(device=True)
    def _mix64(z):
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
        return z ^ (z >> _S31)

    @cuda.jit(device=True)
    def uniform(seed, position):
        """u in [0, 1): the bits of kernels/cpu/sampling._uniform(seed, position)."""
        z = _mix64(np.uint64(seed) + _mix64(np.uint64(position) + _GOLDEN))
        return np.float64(z >> _S11) * (1.0 / 9007199254740992.0)


@cuda.jit(device=True)
def f16_to_f32(h):
    """float32 of the IEEE half whose bits are the integer h (exact, subnormals included)."""
    h = np.int64(h)
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        f = np.float32(m) * _F16_SUBNORMAL
        return -f if sign else f
    if e == 31:
        return as_f32(sign | 0x7F800000 | (m << 13))
    return as_f32(sign | ((e + 112) << 23) | (m << 13))


@cuda.jit(device=True)
def bf16_to_f32(h):
    return as_f32(np.int64(h) << 16)


@cuda.jit(device=True)
def byte_at(w, r, off):
    """Byte off of row r of a quantized weight read as little-endian uint16 words (every GGML
    block here has an even size, so its halves sit on whole words)."""
    return (np.int32(w[r, off // 2]) >> (8 * (off % 2))) & 0xFF


@cuda.jit(device=True)
def float_weight(w, r, k, qt):
    """Element k of row r of a float weight kept as integer bits: F32 (uint32), F16 / BF16
    (uint16). The decode is exact."""
    if qt == F32:
        return as_f32(w[r, k])
    if qt == F16:
        return f16_to_f32(w[r, k])
    return bf16_to_f32(w[r, k])


@cuda.jit(device=True)
def quant_weight(w, r, k, qt):
    """Element k of row r of a GGML block-quantized weight (rows as uint16 words), as the CPU
    decoders and reference.dequantize compute it: Q4_0 d*(q-8), Q4_1 d*q + m, Q8_0 d*q."""
    b, j = k // QK, k % QK
    if qt == Q8_0:
        h = b * (BB_Q8_0 // 2)  # the block's first word: the scale
        q = byte_at(w, r, 2 * h + 2 + j)
        if q > 127:
            q -= 256
        return f16_to_f32(w[r, h]) * np.float32(q)
    h = b * (BB_Q4_0 // 2) if qt == Q4_0 else b * (BB_Q4_1 // 2)
    body = 2 * h + (2 if qt == Q4_0 else 4)
    byte = byte_at(w, r, body + j % 16)
    q = np.float32(byte & 15) if j < 16 else np.float32(byte >> 4)
    if qt == Q4_0:
        return f16_to_f32(w[r, h]) * (q - np.float32(8.0))
    return f16_to_f32(w[r, h]) * q + f16_to_f32(w[r, h + 1])


@cuda.jit(device=True)
def any_weight(w, r, k, qt):
    if qt == Q4_0 or qt == Q4_1 or qt == Q8_0:
        return quant_weight(w, r, k, qt)
    return float_weight(w, r, k, qt)
