"""out = x @ W.T (+ bias) for prefill steps on Hopper's warpgroup tensor cores (wgmma), for W
packed by pack_bf16 with x_bf16: _gemm_mma's products in _gemm_mma's order. Hot path: keep it lean.

A block owns BLOCK_TILES tiles of W (16 rows each) and TOKENS tokens. Its WARPGROUPS
warpgroups each multiply 64 rows of W by all the tokens, one wgmma of m64 n TOKENS k16 per K
tile: A (W) from registers, each warp's 16 x 16 tile read from shared memory in one 128-bit
load (pack_bf16's fragment order is wgmma's A register layout), B (x rounded to bf16, row-major,
round_x) from shared memory through a matrix descriptor. Positions of the summation order
arrive in shared memory by cp.async, STAGE_TILES K tiles a stage, STAGES stages, copies running
STAGES - 2 stages ahead (the slot a refill overwrites was read by wgmmas two stages back, all
complete by then: a warpgroup issues a stage's wgmmas as one group and then waits until only
that group is in flight).

Keeping a stage's wgmmas running while the next stage is set up: (1) the wait for all before
the epilogue is explicit: without it ptxas injects one at the loop's end (tools/kernel_report.py
--sm90a prints its "warpgroup.wait is injected" notes), which would drain every stage; (2) a
wgmma reads its A registers until it completes, so stages alternate between two sets of A
fragments (the stage body is one inlined function, called with either set; ptxas does not
guard this itself); (3) a class starts with scale-d 0 (the wgmma ignores p) rather than p
zeroed by moves: less code in the loop.

Bits: _linear_mma's order (see _gemm_mma): K tiles residue class by residue class (tiles r, r + S,
.. for S = w.slices), each class summed from +0 into fresh accumulators p, folded into the
running totals (registers here) in class order, then the bias. Each K tile is one k16 step
c = A @ B + c, as mma.m16n8k16 does it; that the two instructions round alike is checked on
the GPU (tests/kernels_cuda/test_gemm_wgmma.py compares the bits with _linear_mma's), not
assumed. A class's first step here ignores p (scale-d 0) instead of adding +0: the same sum,
except that a zero may come out -0 where +0 + -0 gives +0; the first class's fold adds +0,
and later folds add to a total that is never -0, so the totals' bits are _linear_mma's.

Opt-in, not the default: the model takes it where asked (VT_CUDA_PREFILL_GEMM=wgmma, on sm_90
with matmul_input_dtype bfloat16; matmul.DeviceWeight.matmul). _gemm_mma stays the default
prefill GEMM unless this kernel is shown faster on the prefill shapes (BENCHMARKS.md, Kernels).
"""

import numpy as np
from numba import cuda, float32, int32, uint32

from vtllm.kernels.cuda._device import SIMULATOR, imin
from vtllm.kernels.cuda._host import aligned, allow_dynamic_shared, check, placeholder
from vtllm.kernels.cuda._linear_mma import TILE_WORDS, PackedBF16, packed_shape
from vtllm.kernels.cuda._ptx import (
    copy_async_commit,
    copy_async_waiter,
    grid_dependency_sync,
    pack_bf16x2,
)
from vtllm.kernels.cuda._ptx_shared import copy_async16_from, shared_u32x4
from vtllm.kernels.cuda._ptx_wgmma import (
    WGMMA,
    b_descriptor,
    b_word,
    proxy_fence,
    wgmma_bf16_for,
    wgmma_commit,
    wgmma_fence,
    wgmma_settler,
    wgmma_waiter,
)

# GPU: 2 warpgroups x 64 rows of W, 128 tokens: 64 accumulators and 64 running totals a
# thread. A K tile in shared memory: 8 KB (W's 8 row tiles, then x's 128 tokens); a stage 4 of
# them, 6 stages: 192 KB, one block an SM. The simulator runs every thread in Python: one
# warpgroup and 16 tokens there, same code.
if SIMULATOR:
    WARPGROUPS, TOKENS, STAGE_TILES, STAGES = 1, 16, 2, 4
else:
    WARPGROUPS, TOKENS, STAGE_TILES, STAGES = 2, 128, 4, 6
_REGISTERS = {}  # (three warpgroups would need max_registers=168 to fit an SM)
_INLINE = {} if SIMULATOR else {"forceinline": True}  # (the simulator's jit has no such option)
THREADS = 128 * WARPGROUPS
BLOCK_TILES = 4 * WARPGROUPS  # row tiles of W a block: warp w multiplies tile w
ACCS = TOKENS // 2  # accumulators a thread (one wgmma's share)
A_FRAGS = 4 * STAGE_TILES  # a warp's A fragments of a stage, per lane
A_WORDS = BLOCK_TILES * TILE_WORDS  # a K tile's W tiles in shared memory, then its x
X_WORDS = 8 * TOKENS  # x of a K tile: 16 bf16 (8 words) a token
TILE_SPAN = A_WORDS + X_WORDS
STAGE_WORDS = STAGE_TILES * TILE_SPAN
SHARED_BYTES = 4 * STAGES * STAGE_WORDS
X_CHUNKS = 2 * TOKENS  # 16-byte copies of a K tile's x: two a token
X_COPIES = -(-X_CHUNKS // THREADS)  # per thread
assert A_WORDS // 4 == THREADS, "one 16-byte copy of W a thread a K tile"
assert STAGES >= 3

_wgmma = wgmma_bf16_for(TOKENS)
_settle = wgmma_settler(TOKENS)
_wait_one = wgmma_waiter(1)
# stage s has landed when at most STAGES - 3 later stages' copy groups are pending
_wait_copies = copy_async_waiter(STAGES - 3)


@cuda.jit(device=True)
def _copy_tile(ops, at, kt, xw, packed, w_at, x_from, x_at, tid):
    """Copies K tile kt of the block's W tiles and tokens to ops[at ..]: W chunk tid (tile
    tid // 32, lane tid % 32, fragment order), then x chunks tid, tid + THREADS, .. (token c //
    2, k half c % 2, to its b_word place). xw and packed are flat; w_at and x_from are this
    thread's offsets in them at K tile 0."""
    copy_async16_from(ops, at + 4 * tid, packed, int32(w_at + kt * TILE_WORDS))
    for u in range(X_COPIES):
        c = tid + u * THREADS
        if X_CHUNKS % THREADS == 0 or c < X_CHUNKS:
            copy_async16_from(ops, at + x_at[u], xw, int32(x_from[u] + 8 * kt))


@cuda.jit(device=True)
def _advance(kt, r, residues, ktiles):
    """The K tile after kt (class r) in the summation order, and its class."""
    kt = int32(kt + residues)
    if kt >= ktiles:
        r = int32(r + 1)
        kt = r
    return kt, r


@cuda.jit(device=True, **_INLINE)
def _stage(
    s,
    fa,
    p,
    total,
    kt,
    r,
    fresh,
    here,
    load_kt,
    load_r,
    ops,
    b_desc,
    xw,
    packed,
    w_at,
    x_from,
    x_at,
    tid,
    ktiles,
    residues,
):
    """Stage s (its slot at ops[here ..]): refill the slot of stage s - 2, issue the stage's
    wgmmas as one group with A fragments in fa, fold each class that ends in it, then wait
    until only this stage's group is in flight. Returns (kt, r, fresh, here, load_kt, load_r)
    stepped past it."""
    warp, lane = tid // 32, tid % 32
    _wait_copies()
    proxy_fence()  # this thread's copies, read next by the tensor cores
    cuda.syncthreads()
    # K tiles from this stage's first to the end, and from the first of the stage refilled
    left = int32(ktiles - s * STAGE_TILES)
    ahead_left = int32(left - (STAGES - 2) * STAGE_TILES)
    # refill the slot stage s - 2 used (its wgmmas have completed: see the docstring)
    refill = int32(here + (STAGES - 2) * STAGE_WORDS)
    if refill >= STAGES * STAGE_WORDS:
        refill = int32(refill - STAGES * STAGE_WORDS)
    for t in range(STAGE_TILES):
        if t < ahead_left:
            _copy_tile(ops, refill + t * TILE_SPAN, load_kt, xw, packed, w_at, x_from, x_at, tid)
            load_kt, load_r = _advance(load_kt, load_r, residues, ktiles)
    copy_async_commit()
    # the stage's A fragments first, then its wgmmas back to back in one group: the tensor
    # cores get STAGE_TILES of them in flight per warpgroup, plus the stage before
    for t in range(STAGE_TILES):
        if t < left:
            at = here + t * TILE_SPAN + warp * TILE_WORDS + 4 * lane
            fa[4 * t], fa[4 * t + 1], fa[4 * t + 2], fa[4 * t + 3] = shared_u32x4(ops, at)
    wgmma_fence()
    for t in range(STAGE_TILES):
        if t < left:
            b_at = int32(here + t * TILE_SPAN + A_WORDS)  # (words: a multiple of 4)
            _wgmma(
                p,
                fa[4 * t],
                fa[4 * t + 1],
                fa[4 * t + 2],
                fa[4 * t + 3],
                ops,
                b_desc + (b_at >> 2),
                1 - fresh,
            )
            fresh = 0
            kt = int32(kt + residues)
            if kt >= ktiles:  # class r is complete: fold it; the next wgmma starts afresh
                wgmma_commit()
                _settle(p)
                for e in range(ACCS):  # (+ 0: _linear_mma sums a class from +0)
                    total[e] = p[e] + np.float32(0.0) if r == 0 else total[e] + p[e]
                fresh = 1
                wgmma_fence()
                r = int32(r + 1)
                kt = r
    wgmma_commit()
    _wait_one()  # the stage before has completed (its slot is refilled two stages on)
    here = int32(here + STAGE_WORDS)
    if here == STAGES * STAGE_WORDS:
        here = int32(0)
    return kt, r, fresh, here, load_kt, load_r


@cuda.jit(cache=True, **_REGISTERS)
def _gemm_kernel(xw, kwords, packed, wwords, bias, has_bias, out, slices):
    grid_dependency_sync()
    M, N = out.shape
    # int32 index arithmetic in the loop (numba's default, int64, takes two instructions a
    # step, and a stage's setup is mostly index arithmetic)
    ktiles, residues = int32(kwords // 8), int32(slices)
    nstages = -(-ktiles // STAGE_TILES)
    tid = cuda.threadIdx.x
    warp, lane = tid // 32, tid % 32
    nt0 = cuda.blockIdx.y * BLOCK_TILES
    t0 = cuda.blockIdx.x * TOKENS
    ops = cuda.shared.array(0, uint32)
    p = cuda.local.array(ACCS, float32)
    total = cuda.local.array(ACCS, float32)
    for e in range(ACCS):
        p[e] = np.float32(0.0)
        total[e] = np.float32(0.0)
    # where this thread copies from and to, the same for every K tile (past W's end or the
    # last token, the last one again: those results are not written)
    w_at = int32(imin(nt0 + tid // 32, N // 16 - 1) * wwords + 4 * (tid % 32))
    x_from = cuda.local.array(X_COPIES, int32)
    x_at = cuda.local.array(X_COPIES, int32)
    for u in range(X_COPIES):
        c = tid + u * THREADS
        x_from[u] = imin(t0 + c // 2, M - 1) * kwords + 4 * (c % 2)
        x_at[u] = A_WORDS + b_word(c // 2 % TOKENS, c % 2)

    load_r = load_kt = int32(0)
    for s in range(STAGES - 2):
        for t in range(STAGE_TILES):
            if s * STAGE_TILES + t < ktiles:
                at = s * STAGE_WORDS + t * TILE_SPAN
                _copy_tile(ops, at, load_kt, xw, packed, w_at, x_from, x_at, tid)
                load_kt, load_r = _advance(load_kt, load_r, residues, ktiles)
        copy_async_commit()

    r = kt = int32(0)
    fresh = 1  # the next wgmma starts a class (scale-d 0: it ignores p)
    here = int32(0)  # stage s's slot, stepped rather than divided
    b_desc = b_descriptor(ops, 0)  # B tiles' descriptors: this one plus their offsets
    # stages in pairs, each with its own A fragments (the docstring's (2))
    fa0 = cuda.local.array(A_FRAGS, uint32)  # registers: constant indices
    fa1 = cuda.local.array(A_FRAGS, uint32)
    for s2 in range(0, nstages, 2):
        s = int32(s2)
        kt, r, fresh, here, load_kt, load_r = _stage(
            s,
            fa0,
            p,
            total,
            kt,
            r,
            fresh,
            here,
            load_kt,
            load_r,
            ops,
            b_desc,
            xw,
            packed,
            w_at,
            x_from,
            x_at,
            tid,
            ktiles,
            residues,
        )
        if s + 1 < nstages:
            kt, r, fresh, here, load_kt, load_r = _stage(
                int32(s + 1),
                fa1,
                p,
                total,
                kt,
                r,
                fresh,
                here,
                load_kt,
                load_r,
                ops,
                b_desc,
                xw,
                packed,
                w_at,
                x_from,
                x_at,
                tid,
                ktiles,
                residues,
            )
    _settle(p)  # all complete already (the last class was settled); said for ptxas: (1)
    # _linear_mma's idle warps add +0 when there are fewer K tiles than slices (-0 to +0)
    zero_fix = ktiles < residues

    # the totals go through shared memory (the stages are free once every warpgroup is past
    # its last wgmma), so that the loop below may index them at run time: a register array
    # indexed so would live in local memory
    cuda.syncthreads()
    sums = cuda.shared.array(0, float32)
    for e in range(ACCS):
        sums[e * THREADS + tid] = total[e]
    g, t = lane // 4, lane % 4
    row0 = 16 * (nt0 + warp) + g
    for j in range(TOKENS // 8):
        tok = t0 + 8 * j + 2 * t
        for e in range(4):  # e: row g (0, 1) or g + 8 (2, 3), token tok or tok + 1
            rr, tk = row0 + 8 * (e // 2), tok + e % 2
            if tk < M and rr < N:
                v = sums[(4 * j + e) * THREADS + tid]
                if zero_fix:
                    v += np.float32(0.0)
                if has_bias:
                    v += bias[rr]
                out[tk, rr] = v


@cuda.jit(cache=True)
def _round_x_kernel(x, xw):
    """xw[m, w] = x[m, 2 w] and x[m, 2 w + 1] rounded to bf16 (nearest even), the first in the
    low half: split_x's hi, row-major."""
    grid_dependency_sync()
    i = cuda.grid(1)
    words = xw.shape[1]
    if i >= xw.shape[0] * words:
        return
    m, w = i // words, i % words
    xw[m, w] = pack_bf16x2(x[m, 2 * w], x[m, 2 * w + 1])


ROUND_THREADS = 256


def round_x(x, x_scratch, *, stream=0):
    """x [M, K] (float32, K a multiple of 16) rounded to bf16 pairs, row-major, in x_scratch
    (uint32, at least M K / 2 words, 16-byte aligned); returns the view xw [M, K / 2]."""
    check("round_x", "x", x, np.float32, 2)
    check("round_x", "x_scratch", x_scratch, np.uint32, 1)
    m, k = x.shape
    if k % 16 or x_scratch.shape[0] < m * k // 2:
        raise ValueError(
            f"round_x: K must be a multiple of 16 and x_scratch hold {m * k // 2} words"
        )
    xw = x_scratch[: m * k // 2].reshape(m, k // 2)
    total = m * k // 2
    if total:
        _round_x_kernel[-(-total // ROUND_THREADS), ROUND_THREADS, stream](x, xw)
    return xw


def gemm_wgmma(xw, w: PackedBF16, out, *, bias=None, stream=0) -> None:
    """out[M, N] = x @ W.T (+ bias[N]) for x rounded by round_x into xw (its return value for
    x [M, K]) and W packed by pack_bf16 with x_bf16. Device arrays; out must not overlap xw."""
    if w.fp8:  # its A comes from shared memory as stored: no room for the FP8 conversion
        raise ValueError("gemm_wgmma: W is FP8 (pack_fp8): prefill takes gemm_mma for it")
    if not WGMMA:
        raise ValueError("gemm_wgmma: wgmma needs an sm_90 (Hopper) GPU")
    if not w.x_bf16:
        raise ValueError("gemm_wgmma: W must be packed with x_bf16 (bf16 matmul inputs)")
    check("gemm_wgmma", "out", out, np.float32, 2)
    m, n = out.shape
    if n != w.n:
        raise ValueError(f"gemm_wgmma: out {out.shape} does not fit W [{w.n}, {w.k}]")
    check("gemm_wgmma", "xw", xw, np.uint32, 2, (m, w.k // 2))
    check("gemm_wgmma", "packed W", w.data, np.uint32, 2, packed_shape(n, w.k))
    if not aligned(w.data, 16) or not aligned(xw, 16):
        raise ValueError("gemm_wgmma: packed W and xw must start on a 16-byte boundary")
    if bias is None:
        bias_arg = placeholder(np.float32)
    else:
        check("gemm_wgmma", "bias", bias, np.float32, 1, (n,))
        bias_arg = bias
    if max(xw.size, w.data.size) >= 1 << 31:
        raise ValueError("gemm_wgmma: xw and packed W must hold fewer than 2**31 words")
    if m == 0:
        return
    # flat views: a thread steps one offset per matrix (its row's start plus the K tile's)
    xw_flat, w_flat = xw.reshape(xw.size), w.data.reshape(w.data.size)
    args = (
        xw_flat,
        xw.shape[1],
        w_flat,
        w.data.shape[1],
        bias_arg,
        bias is not None,
        out,
        w.slices,
    )
    allow_dynamic_shared(_gemm_kernel, args, SHARED_BYTES)
    grid = (-(-m // TOKENS), -(-(n // 16) // BLOCK_TILES))
    _gemm_kernel[grid, THREADS, stream, SHARED_BYTES](*args)
