"""Causal attention of a prefill step's rows over the paged bf16 KV cache on tensor cores,
flash-attention style. Hot path: keep it lean.

Opt-in, not the default (VT_CUDA_FLASH_PREFILL, cuda_flash_prefill; attention.paged_attention's
flash): it is not batch-invariant with the decode kernels. A prompt token gets other bits here
than through the decode path, so a token's output would depend on how its step was cut, which
the default path never allows (the depth-2 law). Kept as the base of the work on prefill speed.

_attention_prefill computes on CUDA cores with the decode kernels' bits (every token's output the
same whichever kernel ran it), which makes it far slower than tensor-core attention and the
larger part of a long prefill. Here the products run as mma.sync (bf16 inputs, float32 sums),
which gives up those bits: q is rounded to bf16 (as an HF bf16 model does), and so are the softmax
weights p before p @ V (as flash attention does); scores, maxima, sums and the output stay
float32. A row's result still depends on nothing but its own query and keys: keys go in tiles
of KEYS from position 0 (not from the step's first token), each tile's max and sums are the
row's own (four lanes of one warp), and a row's place in the tile does not change what an mma
computes for it. So a prompt's rows get the same bits alone or beside others, in one step or
in chunks; but not the decode kernels' bits, and those take a step's leading rows
(attention.paged_attention): a prompt token that lands among them, or comes alone (its
prompt's last chunk of one token), differs by rounding from the same token computed here.

A block owns one kv head and ROWS // G consecutive tokens (G = Hq / Hk query heads each): up to
ROWS (token, head) rows, 16 a warp, lane 4 g + t holding rows g and g + 8 of its warp's (the mma
accumulator layout). Per run of tokens of one sequence in the tile: the rows' q as bf16 A
fragments in registers; then for each tile of KEYS keys (cp.async into shared memory, the next
tile's copies in flight while this one is computed): S = q k^T (K's B fragments by ldmatrix),
masked (causal, and keys past the run's window), scaled by scale * log2(e); the running max and
sum of each row (online softmax with exp2); p rounded to bf16 straight from the accumulators
into A fragments, and o += p V (V's B fragments by ldmatrix.trans). Out = o / sum at the end.
Rows are (token, head) pairs as in _attention_prefill, and tiles are launched heaviest first.

Several times faster than _attention_prefill on long prompts, still behind torch's SDPA
(BENCHMARKS.md, Kernels): two blocks fit an SM, and the key loop carries several other
instructions per mma (masking, online softmax, packing p), so it is most likely bound by
instruction issue rather than by the tensor cores.
"""

import functools
import math

import numpy as np
from numba import cuda, float32, int32, uint32

from vtllm.kernels.cuda._attention_common import _sequence_of, _slot_of_slot, block_shift
from vtllm.kernels.cuda._device import NEG_INF, SIMULATOR, fmax, imin, quad_max, quad_sum
from vtllm.kernels.cuda._host import allow_dynamic_shared
from vtllm.kernels.cuda._ptx import (
    copy_async_commit,
    copy_async_waiter,
    exp2_approx,
    grid_dependency_sync,
    mma_bf16,
    pack_bf16x2,
)
from vtllm.kernels.cuda._ptx_shared import copy_async16_to, ldmatrix_x4, ldmatrix_x4_trans

WARPS = 2 if SIMULATOR else 4
THREADS = 32 * WARPS
ROWS = 16 * WARPS  # (token, head) rows of a block
KEYS = 16 if SIMULATOR else 64  # keys per tile
MAX_GROUP = 16  # query heads per kv head: a tile holds at least ROWS // 16 tokens
_wait_previous = copy_async_waiter(1)  # all but the last committed group of copies landed


def supports(k_cache, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether this kernel takes the shape: a bf16 cache (uint16 bits), heads of 16 .. 128 dims
    in whole mma k steps, at most MAX_GROUP query heads a kv head."""
    return (
        k_cache.dtype == np.uint16
        and head_dim % 16 == 0
        and 16 <= head_dim <= 128
        and num_heads % num_kv_heads == 0
        and num_heads // num_kv_heads <= MAX_GROUP
    )


def _shared_words(head_dim: int) -> int:
    """Two stages of a K tile and a V tile, rows of head_dim bf16 padded by 8 (4 words): the
    8 rows an ldmatrix reads start 4 banks apart, so they do not conflict."""
    return 2 * 2 * KEYS * (head_dim // 2 + 4)


@functools.cache
def _kernel(D: int):
    """The kernel for heads of D dims (register arrays sized at compile time)."""
    CHUNKS = D // 16  # mma k steps of q . k; pairs of 8-dim n tiles of p @ V
    QA = 4 * CHUNKS  # A fragment registers of q
    DT = D // 8  # 8-dim n tiles of o
    RS = D // 2 + 4  # shared row stride in words
    PIECES = D // 8  # 16-byte pieces of a K or V row
    KV_WORDS = KEYS * RS
    STAGE = 2 * KV_WORDS
    NT = KEYS // 8  # 8-key n tiles of S

    LOAD_STEP = THREADS // PIECES  # keys one pass of the block copies
    LOAD_PASSES = -(-KEYS // LOAD_STEP)
    PARTIAL_PASS = KEYS % LOAD_STEP != 0  # only where the simulator's small tiles need it

    @cuda.jit(device=True)
    def load_tile(
        smem, at, k_words, v_words, block_tables, s, hk, Hk, bs, shift, lo, n_keys, key0, piece
    ):
        """Keys lo .. lo + KEYS - 1 of sequence s, kv head hk, to the stage at `at` (K rows,
        then V rows): cp.async for keys before n_keys, zeros past them (their p is 0, and 0
        times a stale NaN would not be). This thread copies 16-byte piece `piece` of keys
        key0, key0 + LOAD_STEP, .."""
        for u in range(LOAD_PASSES):
            key = key0 + u * LOAD_STEP
            if PARTIAL_PASS and key >= KEYS:
                break
            dst = at + key * RS + 4 * piece
            j = lo + key
            if j < n_keys:
                b, off = _slot_of_slot(j, bs, shift)
                row = (block_tables[s, b] * bs + off) * Hk + hk
                copy_async16_to(smem, dst, k_words, row, 4 * piece)
                copy_async16_to(smem, dst + KV_WORDS, v_words, row, 4 * piece)
            else:
                for word in range(4):
                    smem[dst + word] = 0
                    smem[dst + KV_WORDS + word] = 0

    @cuda.jit(cache=True)
    def kernel(
        q,
        k_words,
        v_words,
        block_tables,
        seq_lens,
        query_start_loc,
        scale_log2,
        out,
        first_token,
        bs,
        Hk,
    ):
        grid_dependency_sync()
        tile, hk = cuda.gridDim.x - 1 - cuda.blockIdx.x, cuda.blockIdx.y  # heaviest first
        tid = cuda.threadIdx.x
        w, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        num_blocks = k_words.shape[0] // (bs * Hk)
        G = q.shape[1] // Hk
        per_tile = ROWS // G
        smem = cuda.shared.array(0, uint32)  # dynamic: _shared_words(D) words
        bad = cuda.shared.array(1, int32)
        qa = cuda.local.array(QA, uint32)  # A fragments of q: rows ra and ra + 8
        o = cuda.local.array((DT, 4), float32)
        sc = cuda.local.array((NT, 4), float32)  # S, then p
        shift = block_shift(bs)
        m8 = lane // 8  # the ldmatrix lane's matrix, then its row lane % 8
        k_lane = (8 * (m8 // 2) + lane % 8) * RS + 4 * (m8 % 2)  # keys +8 / dims +8
        v_lane = (8 * (m8 % 2) + lane % 8) * RS + 4 * (m8 // 2)  # transposed: dims +8 / keys +8
        ra = 16 * w + g  # the lane's first row; its second is ra + 8
        key0, piece = tid // PIECES, tid % PIECES  # load_tile's copies
        t_end = imin(first_token + (tile + 1) * per_tile, q.shape[0])
        first = first_token + tile * per_tile
        while first < t_end:  # one run of tokens of one sequence at a time
            s = _sequence_of(query_start_loc, first)
            if s < 0:
                first += 1  # padding row: left unwritten
                continue
            end, ctx = imin(t_end, query_start_loc[s + 1]), seq_lens[s]
            run_start, first = first, end
            n_q = query_start_loc[s + 1] - query_start_loc[s]
            if ctx < n_q or (ctx + bs - 1) // bs > block_tables.shape[1]:
                continue  # metadata that does not fit: the rows stay unwritten
            base = ctx - query_start_loc[s + 1] + 1  # keys seen by token t: base + t
            n_blocks = (base + end - 1 + bs - 1) // bs
            # the first block-table entry outside the cache: rows reaching it stay unwritten
            first_bad = n_blocks
            for b in range(tid, n_blocks, THREADS):
                e = block_tables[s, b]
                if (e < 0 or e >= num_blocks) and b < first_bad:
                    first_bad = b
            cuda.syncthreads()  # the last run's reads of shared memory are done
            if tid == 0:
                bad[0] = n_blocks
            cuda.syncthreads()
            if first_bad < n_blocks:
                cuda.atomic.min(bad, 0, first_bad)
            cuda.syncthreads()
            end = imin(end, bs * bad[0] - base + 1)  # tokens whose whole window is readable
            if end <= run_start:
                continue
            n_rows = (end - run_start) * G
            n_keys = base + end - 1  # the run's longest window
            lim_a, lim_b = 0, 0  # keys each of the lane's rows sees (none past n_rows)
            for half in range(2):
                r = ra + 8 * half
                tt, h = run_start + r // G, hk * G + r % G
                for c in range(CHUNKS):
                    lo_dims, hi_dims = np.uint32(0), np.uint32(0)
                    if r < n_rows:
                        d = 16 * c + 2 * t
                        lo_dims = pack_bf16x2(q[tt, h, d], q[tt, h, d + 1])
                        hi_dims = pack_bf16x2(q[tt, h, d + 8], q[tt, h, d + 9])
                    qa[4 * c + half] = lo_dims
                    qa[4 * c + 2 + half] = hi_dims
                if r < n_rows:
                    if half == 0:
                        lim_a = base + tt
                    else:
                        lim_b = base + tt
            for n in range(DT):
                for e in range(4):
                    o[n, e] = 0.0
            m_a, m_b = NEG_INF, NEG_INF
            l_a, l_b = np.float32(0.0), np.float32(0.0)
            n_tiles = (n_keys + KEYS - 1) // KEYS
            load_tile(
                smem,
                0,
                k_words,
                v_words,
                block_tables,
                s,
                hk,
                Hk,
                bs,
                shift,
                0,
                n_keys,
                key0,
                piece,
            )
            copy_async_commit()
            for kt in range(n_tiles):
                if kt + 1 < n_tiles:
                    load_tile(
                        smem,
                        ((kt + 1) % 2) * STAGE,
                        k_words,
                        v_words,
                        block_tables,
                        s,
                        hk,
                        Hk,
                        bs,
                        shift,
                        (kt + 1) * KEYS,
                        n_keys,
                        key0,
                        piece,
                    )
                copy_async_commit()
                _wait_previous()
                cuda.syncthreads()  # tile kt is in shared memory for every warp
                at = (kt % 2) * STAGE
                for j in range(NT):
                    for e in range(4):
                        sc[j, e] = 0.0
                for jp in range(NT // 2):  # S = q k^T, two 8-key n tiles an ldmatrix
                    for c in range(CHUNKS):
                        b0, b1, b2, b3 = ldmatrix_x4(smem, at + 16 * jp * RS + k_lane + 8 * c)
                        j = 2 * jp
                        sc[j, 0], sc[j, 1], sc[j, 2], sc[j, 3] = mma_bf16(
                            qa[4 * c],
                            qa[4 * c + 1],
                            qa[4 * c + 2],
                            qa[4 * c + 3],
                            b0,
                            b1,
                            sc[j, 0],
                            sc[j, 1],
                            sc[j, 2],
                            sc[j, 3],
                        )
                        j += 1
                        sc[j, 0], sc[j, 1], sc[j, 2], sc[j, 3] = mma_bf16(
                            qa[4 * c],
                            qa[4 * c + 1],
                            qa[4 * c + 2],
                            qa[4 * c + 3],
                            b2,
                            b3,
                            sc[j, 0],
                            sc[j, 1],
                            sc[j, 2],
                            sc[j, 3],
                        )
                # scale (and mask, unless every row sees the whole tile); each row's max
                # over the tile (its four lanes)
                top_a, top_b = NEG_INF, NEG_INF
                if (kt + 1) * KEYS <= base + run_start:
                    for j in range(NT):
                        for e in range(4):
                            sc[j, e] *= scale_log2
                        top_a = fmax(top_a, fmax(sc[j, 0], sc[j, 1]))
                        top_b = fmax(top_b, fmax(sc[j, 2], sc[j, 3]))
                else:
                    for j in range(NT):
                        for e in range(4):
                            key = kt * KEYS + 8 * j + 2 * t + e % 2
                            x = NEG_INF
                            if key < (lim_a if e < 2 else lim_b):
                                x = sc[j, e] * scale_log2
                            sc[j, e] = x
                        top_a = fmax(top_a, fmax(sc[j, 0], sc[j, 1]))
                        top_b = fmax(top_b, fmax(sc[j, 2], sc[j, 3]))
                top_a = fmax(m_a, quad_max(top_a))
                top_b = fmax(m_b, quad_max(top_b))
                sub_a = top_a if top_a != NEG_INF else np.float32(0.0)  # a row with no key yet
                sub_b = top_b if top_b != NEG_INF else np.float32(0.0)
                alpha_a, alpha_b = exp2_approx(m_a - sub_a), exp2_approx(m_b - sub_b)
                m_a, m_b = top_a, top_b
                sum_a, sum_b = np.float32(0.0), np.float32(0.0)
                for j in range(NT):
                    for e in range(4):
                        if e < 2:
                            p = exp2_approx(sc[j, e] - sub_a)
                            sum_a += p
                        else:
                            p = exp2_approx(sc[j, e] - sub_b)
                            sum_b += p
                        sc[j, e] = p
                l_a = l_a * alpha_a + sum_a  # this lane's share; the quad's sum at the end
                l_b = l_b * alpha_b + sum_b
                for n in range(DT):
                    o[n, 0] *= alpha_a
                    o[n, 1] *= alpha_a
                    o[n, 2] *= alpha_b
                    o[n, 3] *= alpha_b
                for kc in range(NT // 2):  # o += p V: 16 keys a k step
                    j = 2 * kc
                    a0, a1 = pack_bf16x2(sc[j, 0], sc[j, 1]), pack_bf16x2(sc[j, 2], sc[j, 3])
                    a2 = pack_bf16x2(sc[j + 1, 0], sc[j + 1, 1])
                    a3 = pack_bf16x2(sc[j + 1, 2], sc[j + 1, 3])
                    v_at = at + KV_WORDS + 16 * kc * RS + v_lane
                    for c in range(CHUNKS):
                        b0, b1, b2, b3 = ldmatrix_x4_trans(smem, v_at + 8 * c)
                        n = 2 * c
                        o[n, 0], o[n, 1], o[n, 2], o[n, 3] = mma_bf16(
                            a0, a1, a2, a3, b0, b1, o[n, 0], o[n, 1], o[n, 2], o[n, 3]
                        )
                        n += 1
                        o[n, 0], o[n, 1], o[n, 2], o[n, 3] = mma_bf16(
                            a0, a1, a2, a3, b2, b3, o[n, 0], o[n, 1], o[n, 2], o[n, 3]
                        )
                cuda.syncthreads()  # tile kt read: its stage may take tile kt + 2
            l_a, l_b = quad_sum(l_a), quad_sum(l_b)
            for half in range(2):
                r = ra + 8 * half
                if r < n_rows:
                    tt, h = run_start + r // G, hk * G + r % G
                    inv = np.float32(1.0) / (l_a if half == 0 else l_b)
                    for n in range(DT):
                        d = 8 * n + 2 * t
                        out[tt, h, d] = o[n, 2 * half] * inv
                        out[tt, h, d + 1] = o[n, 2 * half + 1] * inv

    return kernel


def flash_prefill(
    q,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    out,
    *,
    first_token=0,
    stream=0,
) -> None:
    """As attention.paged_attention (whose launcher has checked the arguments, and `supports`
    the shape), for rows first_token on (the rows before it are left to another kernel)."""
    T, Hq, D = q.shape
    if T <= first_token:
        return
    nb, bs, Hk, _ = k_cache.shape
    per_tile = ROWS // (Hq // Hk)
    grid = (-(-(T - first_token) // per_tile), Hk)
    k_words = k_cache.reshape(nb * bs * Hk, D).view(np.uint32)
    v_words = v_cache.reshape(nb * bs * Hk, D).view(np.uint32)
    scale_log2 = np.float32(scale * math.log2(math.e))
    args = (
        q,
        k_words,
        v_words,
        block_tables,
        seq_lens,
        query_start_loc,
        scale_log2,
        out,
        first_token,
        bs,
        Hk,
    )
    kernel, shared_bytes = _kernel(D), 4 * _shared_words(D)
    allow_dynamic_shared(kernel, args, shared_bytes)
    kernel[grid, THREADS, stream, shared_bytes](*args)
