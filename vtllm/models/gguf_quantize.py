"""Requantize a GGUF file into a llama.cpp-like K-quant mix (Q4_K_M, Q5_K_M, Q6_K), so that a
model vtllm ships (the default SmolLM2 Q4_1) can be run and timed as a K-quant file without
llama.cpp's tools.

The K-quant encoders here are plain round-to-nearest (per sub-block min/max or max|x|, 6-bit
or int8 scales over them), not llama.cpp's searched scales: the files they write decode with
any GGUF reader (gguf-py's dequantize is the check) and are fit for speed runs and for
coherent text, a little below llama-quantize's quality. The mix follows llama.cpp's
llama_tensor_get_type in outline: attn_v and ffn_down get more bits in some layers, the
output (or tied embedding) Q6_K, and a row that is no multiple of 256 falls back as llama.cpp
falls back (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0).

    python -m vtllm.models.gguf_quantize SRC.gguf DST.gguf [Q4_K_M|Q5_K_M|Q6_K]
"""

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

G = GGMLQuantizationType
_FALLBACK = {G.Q4_K: G.Q5_0, G.Q5_K: G.Q5_1, G.Q6_K: G.Q8_0}
# mix -> (most matrices, the "more bits" type for attn_v / ffn_down, output / tied embedding)
MIXES = {"Q4_K_M": (G.Q4_K, G.Q6_K), "Q5_K_M": (G.Q5_K, G.Q6_K), "Q6_K": (G.Q6_K, G.Q6_K)}


def _f16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16)


def _round(v):
    return np.floor(v + 0.5)


def _pack_scales_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 six-bit scales and minimums per row -> the 12 bytes get_scale_min_k4 unpacks."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return out


def _asymmetric(x: np.ndarray, levels: int):
    """Q4_K / Q5_K: (d, dmin f16 [n], sc, m uint8 [n, 8], q uint8 [n, 256]) for super-blocks
    x [n, 256], sub-blocks of 32 mapped to 0..levels with a minimum at or below 0."""
    sub = x.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(axis=2), 0)
    scale = (sub.max(axis=2) - lo) / levels
    d = _f16(scale.max(axis=1) / 63).astype(np.float32)
    dmin = _f16(-lo.min(axis=1) / 63).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(_round(scale / d[:, None])), 0, 63).astype(np.uint8)
        m = np.clip(np.nan_to_num(_round(-lo / dmin[:, None])), 0, 63).astype(np.uint8)
        d1 = (d[:, None] * sc.astype(np.float32))[:, :, None]
        m1 = (dmin[:, None] * m.astype(np.float32))[:, :, None]
        q = np.nan_to_num(_round((sub + m1) / d1))
    q = np.clip(q, 0, levels).astype(np.uint8).reshape(-1, 256)
    return _f16(d), _f16(dmin), sc, m, q


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [N, K] (K % 256 == 0) -> Q4_K blocks uint8 [N, K / 256 * 144]."""
    n = x.shape[0]
    d, dmin, sc, m, q = _asymmetric(x.reshape(-1, 256).astype(np.float32), 15)
    q = q.reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    head = [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2)]
    return np.concatenate([*head, _pack_scales_k4(sc, m), qs], axis=1).reshape(n, -1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """float32 [N, K] (K % 256 == 0) -> Q5_K blocks uint8 [N, K / 256 * 176]."""
    n = x.shape[0]
    d, dmin, sc, m, q = _asymmetric(x.reshape(-1, 256).astype(np.float32), 31)
    q = q.reshape(-1, 4, 2, 32)
    qs = ((q[:, :, 0] & 15) | ((q[:, :, 1] & 15) << 4)).reshape(-1, 128)
    bits = (q >> 4).reshape(-1, 8, 32).astype(np.uint8)  # sub-block j's fifth bits -> bit j
    qh = np.bitwise_or.reduce(bits << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    head = [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2)]
    return np.concatenate([*head, _pack_scales_k4(sc, m), qh, qs], axis=1).reshape(n, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [N, K] (K % 256 == 0) -> Q6_K blocks uint8 [N, K / 256 * 210]."""
    n = x.shape[0]
    sub = x.reshape(-1, 16, 16).astype(np.float32)
    # the value of largest magnitude maps to -32 (as llama.cpp does): no level is wasted
    big = np.take_along_axis(sub, np.abs(sub).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
    scale = -big / 32
    d = _f16(np.abs(scale).max(axis=1) / 127).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.nan_to_num(_round(scale / d[:, None])), -128, 127).astype(np.int8)
        d1 = (d[:, None] * sc.astype(np.float32))[:, :, None]
        q = np.nan_to_num(_round(sub / d1))
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)  # half, part, l
    ql = np.concatenate(
        [q[:, :, 0] & 15 | (q[:, :, 2] & 15) << 4, q[:, :, 1] & 15 | (q[:, :, 3] & 15) << 4],
        axis=2,
    ).reshape(-1, 128)
    qh = q[:, :, 0] >> 4 | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | (q[:, :, 3] >> 4) << 6
    parts = [ql, qh.reshape(-1, 64), sc.view(np.uint8), _f16(d).view(np.uint8).reshape(-1, 2)]
    return np.concatenate(parts, axis=1).reshape(n, -1)


_ENCODERS = {G.Q4_K: quantize_q4_k, G.Q5_K: quantize_q5_k, G.Q6_K: quantize_q6_k}


def encode(w: np.ndarray, qtype: GGMLQuantizationType) -> tuple[np.ndarray, GGMLQuantizationType]:
    """(blocks, the type used): K-quants need rows that are multiples of 256, else the
    llama.cpp fallback type."""
    if qtype in _ENCODERS and w.shape[1] % 256:
        qtype = _FALLBACK[qtype]
    if qtype in _ENCODERS:
        return _ENCODERS[qtype](w), qtype
    return gguf_quantize(w.astype(np.float32), qtype), qtype


def tensor_type(name: str, mix: str, layer_count: int, tied: bool) -> GGMLQuantizationType | None:
    """The mix's type of a weight matrix (None: keep as stored: norms, biases, 1-D)."""
    main, more = MIXES[mix]
    if name == "output.weight" or (name == "token_embd.weight" and tied):
        return G.Q6_K
    if name == "token_embd.weight":
        return main
    if name.endswith(("attn_v.weight", "ffn_down.weight")):
        i = int(name.split(".")[1])
        # llama.cpp's use_more_bits: the first and last eighth of the layers and every third
        if i < layer_count // 8 or i >= 7 * layer_count // 8 or (i - layer_count // 8) % 3 == 2:
            return more
    return main


def requantize(src: Path, dst: Path, mix: str = "Q4_K_M") -> dict[str, str]:
    """Writes dst: src's metadata and tensors, every matrix re-encoded to `mix` from its
    dequantized floats. Returns tensor name -> type name."""
    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture",):
            continue
        if field.name == "general.file_type":
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub)
    names = {t.name for t in reader.tensors}
    layers = int(reader.fields[f"{arch}.block_count"].contents())
    chosen = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # rows first
        qtype = tensor_type(t.name, mix, layers, "output.weight" not in names)
        if len(shape) != 2 or qtype is None:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
            chosen[t.name] = t.tensor_type.name
            continue
        w = gguf_dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)
        blocks, qtype = encode(w, qtype)
        writer.add_tensor(t.name, blocks, raw_dtype=qtype)
        chosen[t.name] = qtype.name
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return chosen


if __name__ == "__main__":
    types = requantize(Path(sys.argv[1]), Path(sys.argv[2]), *(sys.argv[3:4] or ["Q4_K_M"]))
    counts: dict[str, int] = {}
    for name in types.values():
        counts[name] = counts.get(name, 0) + 1
    print(", ".join(f"{n} x{c}" for n, c in sorted(counts.items())))
