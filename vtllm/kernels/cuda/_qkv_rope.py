"""The fused projection's output made ready for attention, in one kernel. Hot path: keep it lean.

One block per (token, head of q, k): the head's D values of qkv, RMS-normed per head when the
model has q/k norms (Qwen3), rotated (NeoX / rotate_half layout, the partner value read through
shared memory), then written where attention reads them: q into a [T, Hq, D] buffer, k and the
head's v straight into the paged cache at slot_mapping[t]. It replaces split_qkv, two rms_norm,
rotary and write_kv launches per layer: five graph nodes become one.

_rope_head does the same work for one head held by a warp, in registers, with the same sums:
the fused attention kernels (rope_attention of _attention_split and _attention_ring) call it.
"""

import math

import numpy as np
from numba import cuda, float32

from vtllm.kernels.cuda._device import MAX_WARPS, block_sum, fma32, lane_xor16, warp_sum
from vtllm.kernels.cuda._host import check
from vtllm.kernels.cuda._kv_cache import check_kv, kv_store
from vtllm.kernels.cuda._ptx import grid_dependency_sync

MAX_DIM = 1024


@cuda.jit(device=True)
def head_inv_rms(ss, D, eps):
    """1 / rms of a head of D values whose squares sum to ss."""
    return np.float32(1.0) / math.sqrt(ss / np.float32(D) + eps)


@cuda.jit(device=True)
def rotated(x, partner, c, s, lower):
    """x rotated with its partner (NeoX layout: dim i < D / 2 pairs with i + D / 2, lower says
    x is the first of the pair); c, s: cos and sin of the pair's angle. One expression for
    every kernel that rotates, so they give the same bits: the fused multiply-add is written
    out, since where the compiler contracts `x * c + y` by itself depends on the code around
    it (lower known at compile time or not)."""
    return fma32(x, c, -(partner * s)) if lower else fma32(x, c, partner * s)


@cuda.jit(device=True)
def _rope_head(x0, x1, x2, x3, w0, w1, w2, w3, c0, s0, c1, s1, lane, D, eps, has_norm, turn):
    """One head of D = 32 n values (n = 1, 2 or 4) held by a warp, lane l dims l, 32 + l, ..
    (x0 .. x3), normed (weights w0 .. w3 at the same dims) and rotated as qkv_rope does it:
    its sums (32 dims by warp_sum, then in order) and its expressions, so its bits. c0, s0
    (c1, s1): cos and sin of the pair of x0 (x1) for D > 32; for D = 32, of lane % 16's.
    Every lane of the warp calls it (warp_sum)."""
    n = D // 32
    if has_norm:
        ss = warp_sum(x0 * x0)
        if n > 1:
            ss += warp_sum(x1 * x1)
        if n > 2:
            ss += warp_sum(x2 * x2)
            ss += warp_sum(x3 * x3)
        inv = head_inv_rms(ss, D, eps)
        x0, x1, x2, x3 = w0 * (x0 * inv), w1 * (x1 * inv), w2 * (x2 * inv), w3 * (x3 * inv)
    if not turn:
        return x0, x1, x2, x3
    if n == 1:  # dim l pairs with l + 16: the lane 16 away
        return rotated(x0, lane_xor16(x0), c0, s0, lane < 16), x1, x2, x3
    if n == 2:  # dim l pairs with 32 + l: the same lane
        return rotated(x0, x1, c0, s0, True), rotated(x1, x0, c0, s0, False), x2, x3
    return (
        rotated(x0, x2, c0, s0, True),
        rotated(x1, x3, c1, s1, True),
        rotated(x2, x0, c0, s0, False),
        rotated(x3, x1, c1, s1, False),
    )


@cuda.jit(device=True)
def _head_values(a, t, at, lane, n):
    """a[t, at + lane + 32 c] for c < n (n = 1, 2 or 4), else 0."""
    z = np.float32(0.0)
    x0 = a[t, at + lane]
    x1 = a[t, at + 32 + lane] if n > 1 else z
    x2 = a[t, at + 64 + lane] if n > 2 else z
    x3 = a[t, at + 96 + lane] if n > 2 else z
    return x0, x1, x2, x3


@cuda.jit(device=True)
def _weight_values(a, lane, n):
    """a[lane + 32 c] for c < n (n = 1, 2 or 4), else 0."""
    z = np.float32(0.0)
    x1 = a[32 + lane] if n > 1 else z
    x2 = a[64 + lane] if n > 2 else z
    x3 = a[96 + lane] if n > 2 else z
    return a[lane], x1, x2, x3


@cuda.jit(cache=True)
def _qkv_rope_kernel(
    qkv, q, k_cache, v_cache, slot_mapping, positions, cos_sin, q_norm, k_norm, eps, has_norm
):
    grid_dependency_sync()
    t, j, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
    Hq, D = q.shape[1], q.shape[2]
    num_blocks, bs, Hk = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    half = D // 2
    is_q = j < Hq
    h = j if is_q else j - Hq
    scratch = cuda.shared.array(MAX_WARPS, float32)
    row = cuda.shared.array(MAX_DIM, float32)
    x = qkv[t, j * D + tid] if tid < D else np.float32(0.0)
    if has_norm:
        ss = block_sum(x * x, scratch)
        inv = head_inv_rms(ss, D, eps)
        if tid < D:
            x = (q_norm[tid] if is_q else k_norm[tid]) * (x * inv)
    row[tid] = x
    cuda.syncthreads()
    p = positions[t]
    if tid < D and 0 <= p < cos_sin.shape[0]:  # padding (-1) or a bad position: not rotated
        i = tid % half
        c, s = cos_sin[p, i], cos_sin[p, half + i]
        x = rotated(x, row[tid + half] if tid < half else row[tid - half], c, s, tid < half)
    if tid >= D:
        return
    if is_q:
        q[t, h, tid] = x
        return
    slot = slot_mapping[t]
    if 0 <= slot < num_blocks * bs:  # padding (-1) or outside the cache: not written
        kv_store(k_cache, slot // bs, slot % bs, h, tid, x)
        kv_store(v_cache, slot // bs, slot % bs, h, tid, qkv[t, (Hq + Hk + h) * D + tid])


def check_qkv_rope(
    op, qkv, q, k_cache, v_cache, slot_mapping, positions, cos_sin, q_norm, k_norm
) -> bool:
    """qkv_rope's checks of its arguments against q [T, Hq, D] (checked by the caller), under
    the name op; returns whether the norms are applied."""
    T, Hq, D = q.shape
    check(op, "qkv", qkv, np.float32, 2)
    check_kv(op, k_cache, v_cache)
    Hk = k_cache.shape[2]
    if qkv.shape != (T, (Hq + 2 * Hk) * D) or k_cache.shape[3] != D or D % 2 or D > MAX_DIM:
        raise ValueError(
            f"{op}: qkv {qkv.shape}, q {q.shape} and k_cache {k_cache.shape} do not fit"
        )
    check(op, "slot_mapping", slot_mapping, np.int32, 1, (T,))
    check(op, "positions", positions, np.int32, 1, (T,))
    check(op, "cos_sin", cos_sin, np.float32, 2)
    if cos_sin.shape[1] != D:
        raise ValueError(f"{op}: cos_sin must be [max_pos, {D}], got {cos_sin.shape}")
    has_norm = q_norm is not None and k_norm is not None
    if has_norm:
        check(op, "q_norm", q_norm, np.float32, 1, (D,))
        check(op, "k_norm", k_norm, np.float32, 1, (D,))
    return has_norm


def qkv_rope(
    qkv,
    q,
    k_cache,
    v_cache,
    slot_mapping,
    positions,
    cos_sin,
    eps,
    *,
    q_norm=None,
    k_norm=None,
    stream=0,
) -> None:
    """From qkv [T, (Hq + 2 Hk) D] float32: q [T, Hq, D] <- rope(norm(q heads)), and the cache
    rows k_cache / v_cache [num_blocks, block_size, Hk, D] at slot_mapping[t] <- rope(norm(k
    heads)) and the v heads (float32 caches, or bf16 bits as uint16: rounded to nearest even).
    Norms (weights [D]) are applied when both are given."""
    check("qkv_rope", "q", q, np.float32, 3)
    has_norm = check_qkv_rope(
        "qkv_rope", qkv, q, k_cache, v_cache, slot_mapping, positions, cos_sin, q_norm, k_norm
    )
    T, Hq, D = q.shape
    Hk = k_cache.shape[2]
    if not has_norm:
        q_norm = k_norm = cos_sin[0]  # never read
    if T == 0:
        return
    threads = max(32, -(-D // 32) * 32)
    _qkv_rope_kernel[(T, Hq + Hk), threads, stream](
        qkv,
        q,
        k_cache,
        v_cache,
        slot_mapping,
        positions,
        cos_sin,
        q_norm,
        k_norm,
        np.float32(eps),
        has_norm,
    )
