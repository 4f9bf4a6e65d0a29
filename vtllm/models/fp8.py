"""FP8 (e4m3fn) weights of HF checkpoints, dequantized to float32 when the model loads (or,
for the CUDA device, kept as codes with a scale per row).

Two ways of storing them are read, as config.json's quantization_config names them:
- quant_method "fp8" (transformers' fine-grained FP8, DeepSeek-V3 and Qwen3 "-FP8" repos):
  `<name>.weight_scale_inv` [ceil(out / bo), ceil(in / bi)] for weight_block_size [bo, bi],
  each element multiplying its block of the weight (a single one without a block size);
- quant_method "compressed-tensors" (llm-compressor's "FP8" / "FP8-dynamic" repos), format
  float-quantized or naive-quantized, fp8 weights: `<name>.weight_scale` per tensor ([1] or a
  scalar), per output channel ([out, 1]) or per block (strategy "block").
W = e4m3(code) * scale in float32. Why float32 and not bf16: the CPU kernels take F32 weights
as they are, and the product of a 4-bit e4m3 significand and a float32 (or bf16) scale fits
float32 exactly or with one rounding, where bf16 storage would round every weight to 8 bits
again, away from what the checkpoint's float32 dequantization gives; the price is 4 bytes a
weight in memory. Activation scales (`input_scale`: static activation quantization) do not
enter a weight-only dequantization and are left unread. Tensors that are not F8_E4M3 (the
norms, the embedding, layers the quantizer ignored) load as they are.

For the CUDA device (keep), the matrices with per-tensor or per-output-channel scales stay FP8:
FP8_ROWS (vtllm.kernels), each row's codes followed by its float32 scale (a per-tensor scale
repeated on every row), which the GPU packs at one byte a weight (kernels/cuda/_fp8). Block
scales (weight_block_size, strategy "block") vary along a row, which a row scale applied after
the sum cannot express: those matrices are dequantized as for the CPU, with one log line.
"""

import json
import logging
import math
from pathlib import Path

import numpy as np

from vtllm.errors import ModelLoadError, UnsupportedModel

log = logging.getLogger(__name__)

CODE_DTYPE = np.uint8  # how the safetensors loader maps F8_E4M3 tensors: their byte codes


def e4m3_table() -> np.ndarray:
    """float32 [256]: each e4m3fn byte S.EEEE.MMM's value (bias 7; subnormal when E = 0; NaN
    for S.1111.111; no infinities), built from the bits."""
    code = np.arange(256, dtype=np.uint32)
    exp, man = (code >> 3) & 0xF, code & 0x7
    # float32 bits: same sign, exponent rebiased 7 -> 127, mantissa shifted to the top
    bits = ((code >> 7) << 31) | ((exp + 120) << 23) | (man << 20)
    table = np.where(exp == 0, 0, bits).view(np.float32).copy()
    sub = exp == 0  # (M / 8) * 2^-6, exact in float32
    table[sub] = np.where(code[sub] >> 7, -1.0, 1.0) * man[sub] * np.float32(2.0**-9)
    table[(exp == 0xF) & (man == 0x7)] = np.nan
    return table


E4M3 = e4m3_table()


class Scheme:
    """Where a checkpoint's weight scales sit and how each one is laid out."""

    def __init__(self, scale_suffix: str, layouts: list, method: str):
        self.scale_suffix = scale_suffix  # "_scale_inv" (fp8) or "_scale" (compressed-tensors)
        self.layouts = layouts  # "tensor", "channel" or a block shape (rows, cols)
        self.method = method


def read_scheme(config: dict, path: Path) -> Scheme | None:
    """The FP8 scheme of config.json's quantization_config; None when there is none. Anything
    but fp8 e4m3 weights fails with one line naming the field."""
    q = config.get("quantization_config")
    if not q:
        return None
    field = "quantization_config"
    method = q.get("quant_method")
    if method == "fp8":
        if q.get("fmt", "e4m3") != "e4m3":
            raise UnsupportedModel(f"{path}: {field}.fmt {q['fmt']!r} (e4m3 only)")
        block = q.get("weight_block_size")
        if block is None:
            return Scheme("_scale_inv", ["tensor"], method)
        if len(block) != 2 or min(block) < 1:
            raise UnsupportedModel(f"{path}: {field}.weight_block_size {block}")
        return Scheme("_scale_inv", [tuple(int(b) for b in block)], method)
    if method == "compressed-tensors":
        fmt = q.get("format")
        if fmt not in ("float-quantized", "naive-quantized"):
            raise UnsupportedModel(
                f"{path}: {field}.format {fmt!r} (float-quantized / naive-quantized fp8 only)"
            )
        layouts = []
        for name, group in (q.get("config_groups") or {}).items():
            layouts.append(
                _group_layout(group.get("weights"), f"{field}.config_groups.{name}", path)
            )
        if not layouts:
            raise UnsupportedModel(f"{path}: {field}.config_groups is empty")
        return Scheme("_scale", layouts, method)
    raise UnsupportedModel(
        f"{path}: {field}.quant_method {method!r} is not supported (fp8, compressed-tensors)"
    )


def _group_layout(weights: dict | None, field: str, path: Path):
    if weights is None:
        raise UnsupportedModel(f"{path}: {field}.weights is null (activation-only quantization)")
    kind, bits = weights.get("type"), weights.get("num_bits")
    if kind != "float" or bits != 8:
        raise UnsupportedModel(
            f"{path}: {field}.weights type {kind!r} num_bits {bits} (fp8 e4m3 weights only)"
        )
    if weights.get("symmetric") is False:
        raise UnsupportedModel(f"{path}: {field}.weights.symmetric false (zero points)")
    strategy = weights.get("strategy")
    if strategy in ("tensor", "channel"):
        return strategy
    if strategy == "block" and len(weights.get("block_structure") or ()) == 2:
        return tuple(int(b) for b in weights["block_structure"])
    raise UnsupportedModel(
        f"{path}: {field}.weights.strategy {strategy!r} (tensor, channel, block)"
    )


def _scale_shape(layout, rows: int, cols: int) -> tuple:
    if layout == "tensor":
        return (1,)
    if layout == "channel":
        return (rows, 1)
    return (math.ceil(rows / layout[0]), math.ceil(cols / layout[1]))


def _as_float32(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.uint16:  # bf16 bits
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


def dequantize(codes: np.ndarray, scale: np.ndarray, layout) -> np.ndarray:
    """float32 [out, in]: e4m3(codes) times the scale of each element's tensor, row or block."""
    rows, cols = codes.shape
    w = E4M3[codes]
    scale = _as_float32(np.asarray(scale))
    if layout == "tensor":
        w *= scale.reshape(())
    elif layout == "channel":
        w *= scale.reshape(rows, 1)
    else:
        br, bc = layout
        w *= np.repeat(np.repeat(scale, br, axis=0), bc, axis=1)[:rows, :cols]
    return w


ROW_LAYOUTS = ("tensor", "channel")  # the scale layouts FP8_ROWS can hold


def fp8_rows(codes: np.ndarray, scale: np.ndarray, layout: str) -> np.ndarray:
    """FP8_ROWS uint8 [out, in + 4]: each row's codes, then its float32 scale's bytes."""
    rows, cols = codes.shape
    scale = _as_float32(np.asarray(scale)).reshape(-1)
    per_row = np.broadcast_to(scale, (rows,)) if layout == "tensor" else scale.reshape(rows)
    out = np.empty((rows, cols + 4), np.uint8)
    out[:, :cols] = codes
    out[:, cols:] = np.ascontiguousarray(per_row, "<f4").view(np.uint8).reshape(rows, 4)
    return out


def dequantize_checkpoint(tensors: dict[str, np.ndarray], directory: Path, keep=None) -> dict:
    """The directory's tensors with every F8_E4M3 weight replaced by its float32 values (and
    the scales dropped); as they are when config.json asks for no quantization. keep(name):
    whether that matrix may stay FP8 (FP8_ROWS, for the CUDA device) where its scales are per
    tensor or per row (the module docstring); None: dequantize them all."""
    path = directory / "config.json"
    scheme = read_scheme(json.loads(path.read_text()), path)
    quantized = [name for name, t in tensors.items() if t.dtype == CODE_DTYPE]
    if scheme is None:
        if quantized:
            raise UnsupportedModel(
                f"{path}: tensor {quantized[0]} is F8_E4M3 but there is no quantization_config"
            )
        return tensors
    out = dict(tensors)
    kept = blocks = 0
    for name in quantized:
        codes = tensors[name]
        scale_name = name + scheme.scale_suffix
        if scale_name not in tensors:
            raise ModelLoadError(f"{directory}: tensor {scale_name} is missing (FP8 {name})")
        if codes.ndim != 2:
            raise UnsupportedModel(f"{directory}: FP8 tensor {name} is {codes.ndim}-D (2-D only)")
        if ((codes & 0x7F) == 0x7F).any():
            raise ModelLoadError(f"{directory}: FP8 tensor {name} holds NaN codes")
        scale = tensors[scale_name]
        layout = _match_layout(scheme.layouts, scale, codes.shape)
        if layout is None:
            raise ModelLoadError(
                f"{directory}: tensor {scale_name} has shape {list(scale.shape)}; {name} "
                f"{list(codes.shape)} under {scheme.method} needs "
                + " or ".join(str(list(_scale_shape(k, *codes.shape))) for k in scheme.layouts)
            )
        if keep is not None and keep(name) and layout in ROW_LAYOUTS:
            out[name] = fp8_rows(codes, scale, layout)
            kept += 1
        else:
            out[name] = dequantize(codes, scale, layout)
            blocks += keep is not None and layout not in ROW_LAYOUTS
        del out[scale_name]
    if any(name.endswith(".input_scale") for name in tensors):
        log.info(
            "%s: input_scale tensors (static FP8 activation quantization) ignored: weights are "
            "dequantized to float32 and activations stay float32",
            directory,
        )
    if blocks:
        log.info(
            "%s: %d block-scaled FP8 matrices dequantized to float32 on cuda too: the GPU keeps "
            "FP8 for per-tensor and per-channel scales only",
            directory,
            blocks,
        )
    if kept:
        log.info("%s: %d FP8 weight matrices kept as e4m3 with row scales", directory, kept)
    log.info("%s: %d FP8 weight matrices dequantized to float32", directory, len(quantized) - kept)
    return out


def _match_layout(layouts: list, scale: np.ndarray, shape: tuple):
    for layout in layouts:
        want = _scale_shape(layout, *shape)
        if layout == "tensor" and scale.size == 1:
            return layout
        if tuple(scale.shape) == want or (layout == "channel" and scale.shape == want[:1]):
            return layout
    return None
