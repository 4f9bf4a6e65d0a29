"""GGUF checkpoints: config from metadata, tensors memory-mapped and kept in their stored type."""

import struct
from pathlib import Path

import numpy as np

from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.kernels import QType
from vtllm.models import gguf_families, moe_checkpoint
from vtllm.models.config import ModelConfig
from vtllm.models.gguf_file import GGUFFile
from vtllm.models.registry import Family, family
from vtllm.models.weights import (
    LayerWeights,
    ModelWeights,
    MoeWeights,
    Weight,
    concat_rows,
    stacked_view,
    weight_from_array,
)

_SUPPORTED_QTYPES = {qt.value: qt for qt in QType}
_FLOAT_VIEWS = {QType.F32: np.float32, QType.F16: np.float16, QType.BF16: np.uint16}


def open_gguf(path: Path) -> GGUFFile:
    try:
        return GGUFFile(path)
    except FileNotFoundError:
        raise ModelLoadError(f"model file not found: {path}") from None
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})") from None


def field(reader: GGUFFile, key: str, default=None):
    return reader.fields.get(key, default)


def read_config(reader, path: Path) -> tuple[ModelConfig, Family]:
    arch = field(reader, "general.architecture")
    if arch is None:
        raise ModelLoadError(f"{path}: GGUF metadata has no general.architecture")
    fam = family(arch, int(field(reader, f"{arch}.expert_count") or 0))

    def need(key: str):
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(need("embedding_length"))
    num_heads = int(need("attention.head_count"))
    names = {t.name for t in reader.tensors}
    layers = int(need("block_count"))
    experts = moe_checkpoint.gguf_config_fields(
        lambda key: field(reader, key), arch, names, layers, path
    )
    vocab = field(reader, f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(field(reader, "tokenizer.ggml.tokens", []))
    head_dim = int(field(reader, f"{arch}.attention.key_length", hidden // num_heads))
    family_fields = {}
    if fam.name in gguf_families.FAMILIES:  # Gemma 2 / 3, Phi-3: their own keys and tensors
        family_fields = gguf_families.config_fields(
            fam.name,
            lambda key: field(reader, key),
            lambda name: _float32_values(reader, name, path),
            path,
            layers=layers,
            hidden=hidden,
            heads=num_heads,
            head_dim=head_dim,
        )
    if "rope_scaling" in family_fields:
        scaling = family_fields.pop("rope_scaling")
    else:
        scaling = _linear_scaling(field(reader, f"{arch}.rope.scaling.type"), need, path)
    eos = field(reader, "tokenizer.ggml.eos_token_id")
    fields = dict(
        architecture=fam.name,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=num_heads,
        num_kv_heads=int(field(reader, f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        intermediate_size=int(need("feed_forward_length")),
        vocab_size=int(vocab),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(field(reader, f"{arch}.context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        qkv_bias=fam.qkv_bias,
        qk_norm=fam.qk_norm,
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=() if eos is None else (int(eos),),
        **experts,
    )
    return ModelConfig(**{**fields, **family_fields}), fam


def _linear_scaling(kind, need, path: Path) -> dict | None:
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    if kind not in (None, "none"):
        raise UnsupportedModel(f"{path}: rope scaling {kind!r} is not supported")
    return None


def _float32_values(reader, name: str, path: Path) -> np.ndarray | None:
    """An F32 tensor's values by name (None when the file has none of that name)."""
    t = next((t for t in reader.tensors if t.name == name), None)
    if t is None:
        return None
    if t.type != QType.F32:
        raise UnsupportedModel(f"{path}: tensor {name} must be F32")
    return np.array(t.data.view(np.float32))


def _unpermute_rows(w: Weight, num_heads: int) -> Weight:
    """Undo llama.cpp's Q/K row permutation so rotary runs in HF's rotate-half layout.

    The converter grouped each head's rows as (pair, 2); HF order is (2, pair). Rows are
    whole quantized blocks, so reordering them needs no dequantization.
    """
    rows = w.shape[0]
    head_dim = rows // num_heads
    order = np.arange(rows).reshape(num_heads, head_dim // 2, 2).swapaxes(1, 2).reshape(-1)
    return Weight(np.ascontiguousarray(w.data[order]), w.qtype, w.shape)


def _unpermute_vector(v: np.ndarray, num_heads: int) -> np.ndarray:
    head_dim = v.shape[0] // num_heads
    order = np.arange(v.shape[0]).reshape(num_heads, head_dim // 2, 2).swapaxes(1, 2).reshape(-1)
    return np.ascontiguousarray(v[order])


def fuse(weights: list[Weight]) -> list[Weight]:
    """One matrix when the storage types agree (one kernel launch), else kept apart. Matrices
    stored back to back (gate, up) become one view of the file; others are copied."""
    if len({w.qtype for w in weights}) == 1:
        return [stacked_view(weights) or concat_rows(weights)]
    return weights


def load_weights(reader, config: ModelConfig, fam: Family, path: Path) -> ModelWeights:
    tensors = {t.name: t for t in reader.tensors}

    def stored(name: str):
        """The tensor and its QType (refused where no kernel reads it)."""
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{path}: tensor {name} is missing")
        qtype = _SUPPORTED_QTYPES.get(t.type)
        if qtype is None:
            from gguf.constants import GGMLQuantizationType

            kind = GGMLQuantizationType(t.type).name
            raise UnsupportedModel(
                f"{path}: tensor {name} has quantization type {kind}, which has "
                f"no kernel here (supported: {', '.join(q.name for q in QType)})"
            )
        return t, qtype

    def matrix(name: str) -> Weight:
        t, qtype = stored(name)
        if len(t.shape) != 2:
            raise ModelLoadError(f"{path}: tensor {name} is not a matrix (shape {t.shape})")
        cols, rows = t.shape  # GGUF lists the fastest dimension first
        data = t.data.view(_FLOAT_VIEWS.get(qtype, np.uint8))
        return weight_from_array(data, qtype, (rows, cols))

    def experts(name: str) -> list[Weight]:
        """A 3-D ffn_*_exps tensor as one matrix per expert, each a view of its bytes."""
        t, qtype = stored(name)
        if len(t.shape) != 3 or t.shape[2] != config.num_experts:
            raise ModelLoadError(
                f"{path}: tensor {name} is not {config.num_experts} experts' matrices "
                f"(shape {t.shape})"
            )
        cols, rows, n = t.shape  # the expert is the slowest dimension: contiguous bytes each
        data = t.data.view(_FLOAT_VIEWS.get(qtype, np.uint8))
        per = data.size // n
        return [
            weight_from_array(data[e * per : (e + 1) * per], qtype, (rows, cols)) for e in range(n)
        ]

    def vector(name: str) -> np.ndarray:
        t = tensors.get(name)
        if t is None:
            raise ModelLoadError(f"{path}: tensor {name} is missing")
        if t.type != QType.F32:
            raise UnsupportedModel(f"{path}: tensor {name} must be F32 (norms, biases)")
        return np.ascontiguousarray(t.data.view(np.float32))

    layers = []
    for i in range(config.num_layers):
        if fam.name in gguf_families.FAMILIES:
            layers.append(gguf_families.load_layer(config, i, set(tensors), matrix, vector, fuse))
            continue
        p = f"blk.{i}."
        q, k, v = (
            matrix(p + "attn_q.weight"),
            matrix(p + "attn_k.weight"),
            matrix(p + "attn_v.weight"),
        )
        if fam.gguf_qk_permuted:
            q = _unpermute_rows(q, config.num_heads)
            k = _unpermute_rows(k, config.num_kv_heads)
        bias = None
        if config.qkv_bias:
            qb, kb = vector(p + "attn_q.bias"), vector(p + "attn_k.bias")
            if fam.gguf_qk_permuted:
                qb = _unpermute_vector(qb, config.num_heads)
                kb = _unpermute_vector(kb, config.num_kv_heads)
            bias = np.concatenate([qb, kb, vector(p + "attn_v.bias")])
        moe, gate_up, down = None, [], None
        if config.is_moe_layer(i):  # kept per expert and unfused: views, never copies
            gate, up, downs = (experts(p + f"ffn_{n}_exps.weight") for n in ("gate", "up", "down"))
            pairs = [[g, u] for g, u in zip(gate, up, strict=True)]
            moe = MoeWeights(matrix(p + "ffn_gate_inp.weight"), pairs, downs)
        else:
            gate_up = fuse([matrix(p + "ffn_gate.weight"), matrix(p + "ffn_up.weight")])
            down = matrix(p + "ffn_down.weight")
        layers.append(
            LayerWeights(
                attn_norm=vector(p + "attn_norm.weight"),
                qkv=fuse([q, k, v]),
                o=matrix(p + "attn_output.weight"),
                ffn_norm=vector(p + "ffn_norm.weight"),
                gate_up=gate_up,
                down=down,
                moe=moe,
                qkv_bias=bias,
                q_norm=vector(p + "attn_q_norm.weight") if config.qk_norm else None,
                k_norm=vector(p + "attn_k_norm.weight") if config.qk_norm else None,
            )
        )
    embed = matrix("token_embd.weight")
    lm_head = embed if config.tie_word_embeddings else matrix("output.weight")
    freq_factors = vector("rope_freqs.weight") if "rope_freqs.weight" in tensors else None
    return ModelWeights(
        embed=embed,
        layers=layers,
        final_norm=vector("output_norm.weight"),
        lm_head=lm_head,
        rope_freq_factors=freq_factors,
    )
