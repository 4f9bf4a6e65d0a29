"""K-quant weights (Q2_K .. Q6_K) for the tensor-core kernels: codes packed in mma fragment order
and compact scales, the device functions that turn them into A fragments and apply the scales,
and the pack kernels that build them from GGUF rows at upload.

A K-quant weight is w = S * u - M: u an unsigned integer code, S = d * sc and M = dmin * m per
sub-block of 16 or 32 weights (Q2_K, Q4_K, Q5_K), or w = S * (u - o) with no minimum (Q6_K:
o = 32, Q3_K: o = 4). Every 16-column K tile lies inside one sub-block, so a tile's part of a
row's sum is S * sum(u x) - M * sum(x). The kernels feed the codes themselves to the tensor
cores: small integers are exact in bf16 (_ptx.codes4_bf16x4 / codes8_bf16x4 build the A
fragment, u - o, in a few instructions), and per tile and token group

    t = mma(codes, x_hi, +0); t = mma(codes, x_lo, t)     (x_hi only for x_bf16 W)
    X = mma(ones, x_hi, +0);  X = mma(ones, x_lo, X)      (types with a minimum)
    acc = fma(S, t, acc);     acc = fma(-M, X, acc)

(kq_apply): no weight is ever rounded. Every route runs these operations on the same
fragments in _linear_mma's tile order, so a row's bits never depend on the step's size. The
zero tiles that pad K in _linear_mma and _linear_rows (packed_shape) have records of zeros,
S = M = 0: they add zeros, which leave a sum begun at +0 as it is (_gemm_mma skips them, as
for bf16 W).

Packed codes (pack_kquant): _linear_mma's tiles, in pack_bf16's fragment order. Q2_K, Q3_K,
Q4_K: four bits a code, one word a lane (NIBBLE_TILE_WORDS a tile), register r's two halves in
the nibbles at bits 4 r and 16 + 4 r. Q5_K, Q6_K: a byte a code in FP8's order (64 words a
tile, _fp8). Scales: per row tile and super-block one record of record_words(kq) words:
first d (and dmin) as float32, lane group g's rows g and g + 8 together (d_g, d_g+8, dmin_g,
dmin_g+8 at word 4 g; without a minimum d_g, d_g+8 at 2 g), then word 8 p + g of the entries:
Q4_K / Q5_K sub-block p's (sc_g, sc_g+8, m_g, m_g+8) bytes; the 16-weight types sub-blocks 2 p
and 2 p + 1 in the low and high halves, each (byte_g, byte_g+8): Q2_K's scale byte
(sc | m << 4), Q3_K's sc - 32 and Q6_K's sc as int8. S and M are computed in the kernel, each
rounded once as the CPU rounds them (kernels/cpu/kquant). Bytes a weight with the codes:
Q2_K 0.59, Q3_K 0.58, Q4_K 0.59, Q5_K 1.09, Q6_K 1.08 (GGUF: 0.33, 0.43, 0.56, 0.69, 0.82).
"""

import numpy as np
from numba import cuda

from vtllm.kernels import KQUANT_BYTES, QK_K, QType
from vtllm.kernels.cuda._device import SIMULATOR, as_f32, f16_to_f32, f32_bits, fma32
from vtllm.kernels.cuda._ptx import (
    codes4_bf16x4,
    codes8_bf16x4,
    grid_dependency_sync,
    load_u32,
    load_u32x2,
    load_u32x4,
    mma_bf16,
    mul_rn,
)
from vtllm.kernels.cuda._ptx_shared import shared_u32x2

Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = (
    int(q) for q in (QType.Q2_K, QType.Q3_K, QType.Q4_K, QType.Q5_K, QType.Q6_K)
)
KQ_TYPES = (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
BB_Q2_K, BB_Q3_K, BB_Q4_K, BB_Q5_K, BB_Q6_K = (KQUANT_BYTES[QType(q)] for q in KQ_TYPES)
NIBBLE_TILE_WORDS = 32  # a 16 x 16 tile of 4-bit codes: a word a lane
BYTE_TILE_WORDS = 64  # of byte codes (FP8's tile)
_ONES = np.uint32(0x3F803F80)  # bf16 pair (1, 1): the A fragment that sums x over a tile
PACK_THREADS = 256


def tile_words(kq: int) -> int:
    return NIBBLE_TILE_WORDS if kq in (Q2_K, Q3_K, Q4_K) else BYTE_TILE_WORDS


def record_words(kq: int) -> int:
    """Words of a (row tile, super-block) scale record (the module docstring)."""
    return 80 if kq in (Q3_K, Q6_K) else 96


def scale_shape(n: int, tiles: int, kq: int) -> tuple[int, int]:
    """The scale records of W [n, K] whose codes are packed in `tiles` K tiles (K's, and the
    zero tiles padding them: a whole number of super-blocks, whose records are zeros)."""
    return n // 16, tiles // (QK_K // 16) * record_words(kq)


def kq_packable(qtype: int, n: int, k: int) -> bool:
    return int(qtype) in KQ_TYPES and n % 16 == 0 and k % QK_K == 0 and n > 0 and k > 0


def _device(fn):
    """A device function of the tensor-core kernels: compiled for the GPU; under the simulator a
    plain call (each call of a device function there swaps module globals under a lock, and
    these run for every tile of every thread)."""
    return fn if SIMULATOR else cuda.jit(device=True)(fn)


if SIMULATOR:
    _as_f32, _fma, _f16_to_f32, _f32_bits = (
        f.py_func for f in (as_f32, fma32, f16_to_f32, f32_bits)
    )
else:
    _as_f32, _fma, _f16_to_f32, _f32_bits = as_f32, fma32, f16_to_f32, f32_bits


def packed_bytes_per_weight(kq: int) -> float:
    """Device bytes a weight, codes and scales (without the zero tiles padding K)."""
    return tile_words(kq) * 4 / 256 + record_words(kq) * 4 / (16 * QK_K)


# -- device functions of the tensor-core kernels (kq: a constant of the calling kernel) -------


@_device
def _nibbles(kq):
    return kq == Q2_K or kq == Q3_K or kq == Q4_K


@_device
def has_min(kq):
    return kq == Q2_K or kq == Q4_K or kq == Q5_K


@_device
def _neg(kq):
    """bf16 pair (-128 - o, -128 - o): codes4 / codes8 give u - o."""
    if kq == Q6_K:
        return np.uint32(0xC320C320)  # -160
    if kq == Q3_K:
        return np.uint32(0xC304C304)  # -132
    return np.uint32(0xC300C300)  # -128


@_device
def _record(kq):
    return 80 if kq == Q3_K or kq == Q6_K else 96


@_device
def kq_tile_words(kq):
    return NIBBLE_TILE_WORDS if _nibbles(kq) else BYTE_TILE_WORDS


@_device
def kq_codes(packed, nt, kt, lane, kq):
    """This lane's codes of tile kt (row tile nt) from global memory, as loaded: (word, 0, 0,
    0) for 4-bit codes, (word, word, 0, 0) for bytes (kq_fragment converts them: raw words
    take fewer registers while a load is in flight)."""
    z = np.uint32(0)
    if _nibbles(kq):
        return load_u32(packed, nt, kt * NIBBLE_TILE_WORDS + lane), z, z, z
    w0, w1 = load_u32x2(packed, nt, kt * BYTE_TILE_WORDS + 2 * lane)
    return w0, w1, z, z


@_device
def kq_fragment(w0, w1, kq):
    """The A fragment (four bf16 pairs) of kq_codes' words."""
    if _nibbles(kq):
        return codes4_bf16x4(w0, _neg(kq))
    return codes8_bf16x4(w0, w1, _neg(kq))


@_device
def kq_fragment_shared(ops, at, lane, kq):
    """The same from a tile copied to shared memory at ops[at ..]."""
    if _nibbles(kq):
        return codes4_bf16x4(ops[at + lane], _neg(kq))
    w0, w1 = shared_u32x2(ops, at + 2 * lane)
    return codes8_bf16x4(w0, w1, _neg(kq))


@_device
def _signed(b):
    return np.float32((np.int32(b) ^ np.int32(128)) - np.int32(128))


@_device
def kq_scales(kscale, nt, kt, lane, kq):
    """(S_g, S_g+8, M_g, M_g+8) of tile kt for this lane's rows g and g + 8 of row tile nt
    (zeros for a tile padding K); zeros where kq is 0 (bf16 and FP8 kernels, which pass any
    uint32 2-D array)."""
    z = np.float32(0.0)
    if kq == 0:
        return z, z, z, z
    g = lane // 4
    rec = (kt // 16) * _record(kq)
    s = kt % 16  # 16-weight sub-block (the 32-weight types: s // 2)
    if has_min(kq):
        w0, w1, w2, w3 = load_u32x4(kscale, nt, rec + 4 * g)
        e = np.int64(load_u32(kscale, nt, rec + 32 + 8 * (s // 2) + g))
        if kq == Q2_K:
            e = e >> (16 * (s % 2))
            sc0, sc1, m0, m1 = e & 15, (e >> 8) & 15, (e >> 4) & 15, (e >> 12) & 15
        else:
            sc0, sc1, m0, m1 = e & 255, (e >> 8) & 255, (e >> 16) & 255, (e >> 24) & 255
        return (
            mul_rn(_as_f32(w0), np.float32(sc0)),
            mul_rn(_as_f32(w1), np.float32(sc1)),
            mul_rn(_as_f32(w2), np.float32(m0)),
            mul_rn(_as_f32(w3), np.float32(m1)),
        )
    w0, w1 = load_u32x2(kscale, nt, rec + 2 * g)
    e = np.int64(load_u32(kscale, nt, rec + 16 + 8 * (s // 2) + g)) >> (16 * (s % 2))
    return (
        mul_rn(_as_f32(w0), _signed(e & 255)),
        mul_rn(_as_f32(w1), _signed((e >> 8) & 255)),
        z,
        z,
    )


@_device
def kq_sums(h0, h1, l0, l1, x_bf16, kq):
    """X: the sums of the token group's x over the tile's 16 columns (row-independent: c0, c1
    and c2, c3 alike), by an mma of ones, hi then lo as the codes' mmas; zeros without a
    minimum. Every lane of the warp calls it together."""
    z = np.float32(0.0)
    if not has_min(kq):
        return z, z, z, z
    u0, u1, u2, u3 = mma_bf16(_ONES, _ONES, _ONES, _ONES, h0, h1, z, z, z, z)
    if x_bf16:
        return u0, u1, u2, u3
    return mma_bf16(_ONES, _ONES, _ONES, _ONES, l0, l1, u0, u1, u2, u3)


@_device
def kq_apply(a0, a1, a2, a3, h0, h1, l0, l1, c0, c1, c2, c3, x_bf16, kq, sc, u):
    """The accumulators c advanced by one tile of codes a against the group's x (hi, lo): the
    module docstring's steps, sc = kq_scales', u = kq_sums'."""
    z = np.float32(0.0)
    t0, t1, t2, t3 = mma_bf16(a0, a1, a2, a3, h0, h1, z, z, z, z)
    if not x_bf16:
        t0, t1, t2, t3 = mma_bf16(a0, a1, a2, a3, l0, l1, t0, t1, t2, t3)
    sg, sg8, mg, mg8 = sc
    c0 = _fma(sg, t0, c0)
    c1 = _fma(sg, t1, c1)
    c2 = _fma(sg8, t2, c2)
    c3 = _fma(sg8, t3, c3)
    if has_min(kq):
        u0, u1, u2, u3 = u
        c0 = _fma(-mg, u0, c0)
        c1 = _fma(-mg, u1, c1)
        c2 = _fma(-mg8, u2, c2)
        c3 = _fma(-mg8, u3, c3)
    return c0, c1, c2, c3


# -- packing (at upload) ------------------------------------------------------------------------


@_device
def _block_bytes(kq):
    if kq == Q2_K:
        return BB_Q2_K
    if kq == Q3_K:
        return BB_Q3_K
    if kq == Q4_K:
        return BB_Q4_K
    return BB_Q5_K if kq == Q5_K else BB_Q6_K


@_device
def _byte(w, row, at):
    return np.int32(w[row, at])


@_device
def _code(w, row, col, kq):
    """The unsigned code u of weight (row, col) of GGUF rows w (uint8), as ggml lays it out."""
    o = (col // QK_K) * _block_bytes(kq)
    j = col % QK_K
    if kq == Q4_K or kq == Q5_K:  # 64-weight runs: 32 bytes, low nibbles then high
        c, l = j // 64, j % 64
        at = o + (16 if kq == Q4_K else 48) + 32 * c + l % 32
        u = (_byte(w, row, at) >> (4 * (l // 32))) & 15
        if kq == Q5_K:  # fifth bit: bit 2 c + (l >= 32) of qh byte l % 32
            u |= ((_byte(w, row, o + 16 + l % 32) >> (2 * c + l // 32)) & 1) << 4
        return u
    n, l = j // 128, j % 128  # 128-weight halves: four 32-weight runs over 32 bytes
    q, l2 = l // 32, l % 32
    if kq == Q6_K:
        low = (_byte(w, row, o + 64 * n + l2 + 32 * (q & 1)) >> (4 * (q >> 1))) & 15
        return low | (((_byte(w, row, o + 128 + 32 * n + l2) >> (2 * q)) & 3) << 4)
    u = (_byte(w, row, o + (16 if kq == Q2_K else 32) + 32 * n + l2) >> (2 * q)) & 3
    if kq == Q3_K:  # a set hmask bit 4 n + q adds 4 (a clear one subtracts 4 from u - 4)
        u |= ((_byte(w, row, o + l2) >> (4 * n + q)) & 1) << 2
    return u


@cuda.jit(cache=True)
def _pack_codes_kernel(w, packed, kq, ktiles):
    """One packed word per thread (the module docstring's layout); tiles past K are zeros."""
    grid_dependency_sync()
    i = cuda.grid(1)
    per_row = packed.shape[1]
    if i >= packed.shape[0] * per_row:
        return
    nt, rem = i // per_row, i % per_row
    if _nibbles(kq):
        kt, lane, h = rem // NIBBLE_TILE_WORDS, rem % NIBBLE_TILE_WORDS, 0
    else:
        kt, q = rem // BYTE_TILE_WORDS, rem % BYTE_TILE_WORDS
        lane, h = q // 2, q % 2
    if kt >= ktiles:
        packed[nt, rem] = np.uint32(0)
        return
    row = 16 * nt + lane // 4
    col = 16 * kt + 2 * (lane % 4)
    v = np.int64(0)
    if _nibbles(kq):  # register r: row g + 8 (r & 1), columns 2 t + 8 (r >> 1) + {0, 1}
        for r in range(4):
            for half in range(2):
                u = _code(w, row + 8 * (r & 1), col + 8 * (r >> 1) + half, kq)
                v |= np.int64(u) << (4 * r + 16 * half)
    else:  # word h: registers 2 h (row g) and 2 h + 1 (row g + 8), columns 2 t + 8 h + {0, 1}
        c = col + 8 * h
        v = (
            np.int64(_code(w, row, c, kq))
            | (np.int64(_code(w, row, c + 1, kq)) << 8)
            | (np.int64(_code(w, row + 8, c, kq)) << 16)
            | (np.int64(_code(w, row + 8, c + 1, kq)) << 24)
        )
    packed[nt, rem] = np.uint32(v)


@_device
def _f16(w, row, at):
    return _f16_to_f32(_byte(w, row, at) | (_byte(w, row, at + 1) << 8))


@_device
def _entry(w, row, o, s, kq):
    """Sub-block s's scale byte of a 16-weight type as the record keeps it."""
    if kq == Q2_K:
        return _byte(w, row, o + s)
    if kq == Q6_K:
        return _byte(w, row, o + 192 + s)
    a = o + 96  # Q3_K: 6-bit scales, low nibbles in bytes 0..7, high pairs in bytes 8..11
    low = _byte(w, row, a + s) & 15 if s < 8 else _byte(w, row, a + s - 8) >> 4
    high = (_byte(w, row, a + 8 + s % 4) >> (2 * (s // 4))) & 3
    return ((low | (high << 4)) - 32) & 255


@_device
def _scale_min(w, row, o, s):
    """Q4_K / Q5_K: the 6-bit (sc, m) of 32-weight sub-block s (the 12 bytes at o + 4)."""
    a = o + 4
    if s < 4:
        return _byte(w, row, a + s) & 63, _byte(w, row, a + s + 4) & 63
    sc = (_byte(w, row, a + s + 4) & 15) | ((_byte(w, row, a + s - 4) >> 6) << 4)
    m = (_byte(w, row, a + s + 4) >> 4) | ((_byte(w, row, a + s) >> 6) << 4)
    return sc, m


@cuda.jit(cache=True)
def _pack_scales_kernel(w, scales, kq):
    """One record word per thread (the module docstring's layout)."""
    grid_dependency_sync()
    i = cuda.grid(1)
    per_row = scales.shape[1]
    if i >= scales.shape[0] * per_row:
        return
    nt, rem = i // per_row, i % per_row
    b, e = rem // _record(kq), rem % _record(kq)
    if b >= w.shape[1] // _block_bytes(kq):  # a padding super-block
        scales[nt, rem] = np.uint32(0)
        return
    o = b * _block_bytes(kq)
    dw = 32 if has_min(kq) else 16
    if e < dw:
        if has_min(kq):  # d_g, d_g+8, dmin_g, dmin_g+8
            row, second = 16 * nt + e // 4 + 8 * (e % 2), (e % 4) // 2
            at = o + (80 if kq == Q2_K else 0) + 2 * second
        else:  # d_g, d_g+8
            row, at = 16 * nt + e // 2 + 8 * (e % 2), o + (108 if kq == Q3_K else 208)
        scales[nt, rem] = np.uint32(_f32_bits(_f16(w, row, at)))
        return
    e -= dw
    row, p = 16 * nt + e % 8, e // 8
    if kq == Q4_K or kq == Q5_K:
        sc0, m0 = _scale_min(w, row, o, p)
        sc1, m1 = _scale_min(w, row + 8, o, p)
        v = np.int64(sc0) | (np.int64(sc1) << 8) | (np.int64(m0) << 16) | (np.int64(m1) << 24)
    else:
        v = (
            np.int64(_entry(w, row, o, 2 * p, kq))
            | (np.int64(_entry(w, row + 8, o, 2 * p, kq)) << 8)
            | (np.int64(_entry(w, row, o, 2 * p + 1, kq)) << 16)
            | (np.int64(_entry(w, row + 8, o, 2 * p + 1, kq)) << 24)
        )
    scales[nt, rem] = np.uint32(v)


def pack_kquant(rows, kq: int, packed, scales, *, stream=0) -> None:
    """rows (device uint8 [N, K / 256 x block bytes], GGUF K-quant rows of type kq) packed into
    packed (uint32, _linear_mma.packed_shape(N, K, kq=kq)) and scales (uint32, scale_shape(N,
    the packed tiles, kq)); enqueued on stream."""
    ktiles = rows.shape[1] // KQUANT_BYTES[QType(kq)] * (QK_K // 16)
    total = packed.shape[0] * packed.shape[1]
    _pack_codes_kernel[-(-total // PACK_THREADS), PACK_THREADS, stream](rows, packed, kq, ktiles)
    total = scales.shape[0] * scales.shape[1]
    _pack_scales_kernel[-(-total // PACK_THREADS), PACK_THREADS, stream](rows, scales, kq)
