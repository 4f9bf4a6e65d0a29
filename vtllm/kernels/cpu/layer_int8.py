"""One whole decoder layer of the `fast` numerics in a single call. Hot path: keep it lean.

A decode step of a small model is mostly fixed costs: ~10 Python-level launches per layer
(argument checks, dispatch, reacquiring the GIL), whose overhead together is of the order of
the layer's math. Here one njit function per layer calls the same compiled kernels the
launchers call (norm, int8 linear, rotary, KV write, paged attention, silu) in the order of
models.llama's generic loop, on the same buffers, so every output bit is the one the generic
loop produces (tests/models/test_fast_numerics.py compares them).

The on-disk cache needs care here: a cached caller embeds its callees' machine code, and numba
only checks the caller's own file for changes, so an edit to attention.py (for instance) would
leave a cached layer running the old attention. `stamp_with` makes the cache entry's stamp
cover every file whose code ends up inside. Compiling the layer is slow (once per machine
and change); without the cache every process would pay it.
"""

import numba
import numpy as np
from numba import njit

from vtllm import kernels
from vtllm.kernels import QK
from vtllm.kernels.cpu import (
    _int8simd,
    _simd,
    activation,
    attention,
    linear_int8,
    norm,
    quant,
    quant_int8,
    rope,
)
from vtllm.kernels.cpu._cache import stamp_with
from vtllm.kernels.cpu.activation import (
    PARALLEL_MIN,
    _silu_and_mul_kernel,
    _silu_and_mul_parallel,
)
from vtllm.kernels.cpu.attention import _paged_attention_kernel, _write_kv_kernel
from vtllm.kernels.cpu.linear_int8 import (
    GEMM_MIN_M,
    QUANTIZED,
    _gemm_kernel,
    _gemv_kernel,
    tile_rows_for,
)
from vtllm.kernels.cpu.norm import _rms_norm_kernel
from vtllm.kernels.cpu.quant import BB_Q4_0, BB_Q4_1, BB_Q8_0, Q4_0, Q4_1
from vtllm.kernels.cpu.rope import _rotary_kernel

# error codes of _layer (the launcher turns them into the launchers' own messages)
_BAD_SHAPE, _BAD_POSITION, _BAD_SLOT, _BAD_ATTENTION = 1, 2, 3, 4


@njit(inline="always")
def _row_bytes(qt, k):
    bb = BB_Q4_1 if qt == Q4_1 else (BB_Q4_0 if qt == Q4_0 else BB_Q8_0)
    return k // QK * bb


@njit(inline="always")
def _linear(x, w, qt, bias, out, nthr):
    """linear_int8's dispatch without its Python checks (the caller checked the shapes)."""
    M, N = out.shape
    if M < GEMM_MIN_M:
        _gemv_kernel(x, w, qt, bias, out, nthr)
    else:
        _gemm_kernel(x, w, qt, bias, out, tile_rows_for(M, N, nthr))


@njit(inline="always")
def _fits(w, qt, k, n):
    return w.shape[0] == n and k % QK == 0 and w.shape[1] == _row_bytes(qt, k)


@njit(nogil=True, cache=True)
def _layer(
    first,
    residual,
    h,
    x,
    qkv,
    q,
    k,
    v,
    attn,
    gate_up,
    act,
    attn_norm,
    w_qkv,
    qt_qkv,
    bias_qkv,
    w_o,
    qt_o,
    ffn_norm,
    w_gu,
    qt_gu,
    w_down,
    qt_down,
    eps,
    k_cache,
    v_cache,
    positions,
    cos_sin,
    slot_mapping,
    block_tables,
    seq_lens,
    query_start_loc,
    scale,
    nthr,
):
    T, H = x.shape
    qs, kvs = q.shape[1] * q.shape[2], k.shape[1] * k.shape[2]
    inter = act.shape[1]
    if not (
        residual.shape == x.shape
        and h.shape == x.shape
        and qkv.shape == (T, qs + 2 * kvs)
        and q.shape[0] == T
        and k.shape == v.shape
        and k.shape[0] == T
        and q.shape[2] == k.shape[2]
        and attn.shape == q.shape
        and gate_up.shape == (T, 2 * inter)
        and act.shape[0] == T
        and attn_norm.shape[0] == H
        and ffn_norm.shape[0] == H
        and k_cache.shape == v_cache.shape
        and k_cache.shape[2:] == k.shape[1:]
        and q.shape[1] % k.shape[1] == 0
        and cos_sin.shape[1] == q.shape[2]
        and positions.shape[0] == T
        and slot_mapping.shape[0] == T
        and query_start_loc.shape[0] == seq_lens.shape[0] + 1
        and block_tables.shape[0] == seq_lens.shape[0]
        and _fits(w_qkv, qt_qkv, H, qs + 2 * kvs)
        and _fits(w_o, qt_o, qs, H)
        and _fits(w_gu, qt_gu, H, 2 * inter)
        and _fits(w_down, qt_down, inter, H)
        and (bias_qkv.shape[0] == 0 or bias_qkv.shape[0] == qs + 2 * kvs)
    ):
        return _BAD_SHAPE
    eps, scale = np.float32(eps), np.float32(scale)
    if first:
        _rms_norm_kernel(residual, attn_norm, eps, x, x, False)
    else:  # residual += h (the last MLP output), x = norm(residual)
        _rms_norm_kernel(h, attn_norm, eps, x, residual, True)
    _linear(x, w_qkv, qt_qkv, bias_qkv, qkv, nthr)
    qf, kf, vf = q.reshape(T, qs), k.reshape(T, kvs), v.reshape(T, kvs)
    for t in range(T):
        qf[t] = qkv[t, :qs]
        kf[t] = qkv[t, qs : qs + kvs]
        vf[t] = qkv[t, qs + kvs :]
    if _rotary_kernel(q, k, positions, cos_sin) >= 0:
        return _BAD_POSITION
    if _write_kv_kernel(k, v, k_cache, v_cache, slot_mapping) >= 0:
        return _BAD_SLOT
    bad = _paged_attention_kernel(
        q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, attn
    )
    if bad >= 0:
        return _BAD_ATTENTION
    _linear(attn.reshape(T, qs), w_o, qt_o, np.empty(0, np.float32), h, nthr)
    _rms_norm_kernel(h, ffn_norm, eps, x, residual, True)
    _linear(x, w_gu, qt_gu, np.empty(0, np.float32), gate_up, nthr)
    if act.size >= PARALLEL_MIN:
        _silu_and_mul_parallel(gate_up, act)
    else:
        _silu_and_mul_kernel(gate_up, act)
    _linear(act, w_down, qt_down, np.empty(0, np.float32), h, nthr)
    return 0


stamp_with(
    _layer,
    (kernels, _int8simd, _simd, activation, attention, linear_int8, norm, quant, quant_int8, rope),
)


def layer_weights(
    attn_norm, w_qkv, qt_qkv, bias_qkv, w_o, qt_o, ffn_norm, w_gate_up, qt_gate_up, w_down, qt_down
) -> tuple | None:
    """The `weights` argument of decoder_layer for one layer (bias_qkv may be None), or None
    when a matrix is of a type without int8 kernels. Arrays become read-only views, so every
    layer of every model calls one compiled specialization."""
    if not all(int(qt) in QUANTIZED for qt in (qt_qkv, qt_o, qt_gate_up, qt_down)):
        return None
    if any(w.dtype != np.uint8 or w.ndim != 2 for w in (w_qkv, w_o, w_gate_up, w_down)):
        return None
    if bias_qkv is None:
        bias_qkv = np.zeros(0, np.float32)
    out = []
    for a in (
        attn_norm,
        w_qkv,
        qt_qkv,
        bias_qkv,
        w_o,
        qt_o,
        ffn_norm,
        w_gate_up,
        qt_gate_up,
        w_down,
        qt_down,
    ):
        if isinstance(a, np.ndarray):
            a = np.ascontiguousarray(a).view()
            a.flags.writeable = False
        else:
            a = int(a)
        out.append(a)
    return tuple(out)


def decoder_layer(
    first: bool,
    bufs: tuple,
    weights: tuple,
    eps: float,
    k_cache,
    v_cache,
    positions,
    cos_sin,
    slot_mapping,
    block_tables,
    seq_lens,
    query_start_loc,
    scale: float,
) -> None:
    """One pre-norm decoder layer over T tokens, as models.llama's generic loop runs it:

        residual (+= h unless first); x = rms_norm(residual) * attn_norm
        qkv = x @ W_qkv.T (+ bias); q, k = rotary(q, k); KV cache <- k, v
        attn = paged_attention(q); h = attn @ W_o.T
        residual += h; x = rms_norm(residual) * ffn_norm
        h = silu_and_mul(x @ W_gate_up.T) @ W_down.T

    bufs = (residual, h, x, qkv, q, k, v, attn, gate_up, act), float32 C-contiguous scratch
    of the shapes the generic loop uses ([T, hidden], ..., q [T, Hq, D], k and v [T, Hk, D]);
    residual and h carry the state from layer to layer. weights = (attn_norm, w_qkv, qt_qkv,
    bias_qkv (empty: none), w_o, qt_o, ffn_norm, w_gate_up, qt_gate_up, w_down, qt_down) with
    the matrices as uint8 GGML blocks, as layer_weights returns it. The rest are the arguments
    of rotary, write_kv and paged_attention."""
    code = _layer(
        bool(first),
        *bufs,
        *weights,
        float(eps),
        k_cache,
        v_cache,
        positions,
        cos_sin,
        slot_mapping,
        block_tables,
        seq_lens,
        query_start_loc,
        float(scale),
        numba.get_num_threads(),
    )
    if code == _BAD_SHAPE:
        raise ValueError("decoder_layer: weights do not match the buffers' shapes")
    if code == _BAD_POSITION:
        raise ValueError(f"decoder_layer: a position is outside [0, {cos_sin.shape[0]})")
    if code == _BAD_SLOT:
        raise ValueError("decoder_layer: a KV slot is outside the cache")
    if code == _BAD_ATTENTION:
        raise ValueError("decoder_layer: sequences, block tables and seq_lens are inconsistent")
