"""HF checkpoint directories: config.json plus *.safetensors, memory-mapped without copies.

The safetensors header is parsed here and each tensor becomes a numpy view into one read-only
memory map per file, so loading costs no RAM beyond the pages the kernels touch.
"""

import json
import struct
from pathlib import Path

import numpy as np

from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.kernels import FP8_ROWS, QType
from vtllm.models import fp8, gemma_checkpoint, moe_checkpoint, phi3_checkpoint
from vtllm.models.config import ModelConfig
from vtllm.models.registry import family_for_hf, lookup
from vtllm.models.weights import LayerWeights, ModelWeights, Weight

_DTYPES = {
    "F32": (np.float32, QType.F32),
    "F16": (np.float16, QType.F16),
    "BF16": (np.uint16, QType.BF16),
    "F8_E4M3": (fp8.CODE_DTYPE, None),  # byte codes, dequantized at load (models/fp8)
}


def read_config(directory: Path) -> ModelConfig:
    path = directory / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{directory}: config.json is missing") from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: invalid JSON ({exc})") from None
    fam = family_for_hf(cfg.get("architectures") or [cfg.get("model_type", "?")])
    try:
        if fam.name == "phi3":
            return phi3_checkpoint.read_config(cfg, fam, path)
        if fam.forward == "gemma":
            return gemma_checkpoint.read_config(cfg, fam, path)
        if fam.forward == "moe":
            return moe_checkpoint.read_config(cfg, fam, path)
        hidden = int(cfg["hidden_size"])
        num_heads = int(cfg["num_attention_heads"])
        scaling = cfg.get("rope_scaling") or None
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in ("llama3", "linear", "default"):
                raise UnsupportedModel(f"{path}: rope scaling {kind!r} is not supported")
            scaling = None if kind == "default" else {**scaling, "rope_type": kind}
        eos = cfg.get("eos_token_id")
        layers = int(cfg["num_hidden_layers"])
        window, sliding = _window_layers(cfg, fam.name, layers)
        return ModelConfig(
            architecture=fam.name,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=fam.qkv_bias or bool(cfg.get("attention_bias", False)),
            qk_norm=fam.qk_norm,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=tuple([eos] if isinstance(eos, int) else (eos or [])),
            sliding_window=window,
            sliding_layers=sliding,
        )
    except KeyError as exc:
        raise ModelLoadError(f"{path}: missing field {exc.args[0]}") from None


def _window_layers(cfg: dict, family: str, layers: int) -> tuple[int, tuple[bool, ...]]:
    """(sliding_window, which layers it applies to), as HF's config classes decide it:
    Mistral windows every layer when sliding_window is set (Mistral-7B-v0.1: 4096); Qwen2 and
    Qwen3 only with use_sliding_window, on the layers layer_types names "sliding_attention"
    (without layer_types: layers from max_window_layers on, HF's default 28)."""
    window = int(cfg.get("sliding_window") or 0)
    if family == "mistral" and window:
        return window, (True,) * layers
    if family in ("qwen2", "qwen3") and cfg.get("use_sliding_window") and window:
        types = cfg.get("layer_types")
        if types is None:
            first = int(cfg.get("max_window_layers", 28))
            types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
        sliding = tuple(t == "sliding_attention" for t in types)
        if len(sliding) != layers:
            raise UnsupportedModel(f"layer_types has {len(sliding)} entries for {layers} layers")
        if any(sliding):
            return window, sliding
    return 0, (False,) * layers


def _map_file(path: Path) -> dict[str, np.ndarray]:
    try:
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > 100 << 20:
                raise ValueError("header too large")
            header = json.loads(f.read(header_len))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(f"{path}: not a readable safetensors file ({exc})") from None
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise UnsupportedModel(f"{path}: tensor {name} has dtype {info['dtype']}")
        start, end = info["data_offsets"]
        if base + end > raw.size:
            raise ModelLoadError(f"{path}: tensor {name} runs past the end of the file")
        view = raw[base + start : base + end].view(dtype[0]).reshape(info["shape"])
        tensors[name] = view
    return tensors


def map_tensors(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor of the directory's *.safetensors files, as memory-mapped views (bf16 as
    its uint16 bits)."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory}: no *.safetensors files")
    tensors: dict[str, np.ndarray] = {}
    for path in files:
        tensors.update(_map_file(path))
    return tensors


def _fp8_stays(name: str) -> bool:
    """The FP8 matrices that the CUDA device may keep as FP8: the layers' projections and an
    untied head (the matmuls), not the embedding (row lookups)."""
    return name.endswith("_proj.weight") or name == "lm_head.weight"


def load_weights(directory: Path, config: ModelConfig, *, fp8_rows: bool = False) -> ModelWeights:
    """fp8_rows (the CUDA device): FP8 matrices with per-tensor or per-channel scales stay FP8
    (models/fp8, FP8_ROWS); the MoE families' experts take dequantized weights only, so they
    keep float32 there."""
    forward = lookup(config.architecture).forward
    keep = _fp8_stays if fp8_rows and forward != "moe" else None
    tensors = fp8.dequantize_checkpoint(map_tensors(directory), directory, keep)

    def get(name: str) -> np.ndarray:
        try:
            return tensors[name]
        except KeyError:
            raise ModelLoadError(f"{directory}: tensor {name} is missing") from None

    def matrix(name: str) -> Weight:
        data = get(name)
        if data.dtype == np.uint8:  # FP8 rows: codes, then the 4 bytes of the row's scale
            return Weight(data, FP8_ROWS, (int(data.shape[0]), int(data.shape[1]) - 4))
        qtype = {np.float32: QType.F32, np.float16: QType.F16, np.uint16: QType.BF16}[
            data.dtype.type
        ]
        return Weight(data, qtype, (int(data.shape[0]), int(data.shape[1])))

    def vector(name: str) -> np.ndarray:
        data = get(name)
        if data.dtype == np.uint16:  # bf16 bits -> float32
            return (data.astype(np.uint32) << 16).view(np.float32)
        return data.astype(np.float32)

    if config.architecture == "phi3":
        return phi3_checkpoint.load_weights(tensors, config, directory, matrix, vector)
    if forward == "gemma":
        return gemma_checkpoint.load_weights(tensors, config, directory, matrix, vector)
    if forward == "moe":
        return moe_checkpoint.load_weights(tensors, config, directory, matrix, vector)
    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        bias = None
        if config.qkv_bias:
            bias = np.concatenate([vector(a + f"{n}_proj.bias") for n in "qkv"])
        layers.append(
            LayerWeights(
                attn_norm=vector(p + "input_layernorm.weight"),
                qkv=[matrix(a + f"{n}_proj.weight") for n in "qkv"],
                o=matrix(a + "o_proj.weight"),
                ffn_norm=vector(p + "post_attention_layernorm.weight"),
                gate_up=[matrix(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")],
                down=matrix(p + "mlp.down_proj.weight"),
                qkv_bias=bias,
                q_norm=vector(a + "q_norm.weight") if config.qk_norm else None,
                k_norm=vector(a + "k_norm.weight") if config.qk_norm else None,
            )
        )
    embed = matrix("model.embed_tokens.weight")
    tied = config.tie_word_embeddings or "lm_head.weight" not in tensors
    return ModelWeights(
        embed=embed,
        layers=layers,
        final_norm=vector("model.norm.weight"),
        lm_head=embed if tied else matrix("lm_head.weight"),
    )
