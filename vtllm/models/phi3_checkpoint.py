"""Phi-3 HF checkpoints (Phi3ForCausalLM: Phi-3 mini / medium, Phi-3.5-mini, Phi-4-mini):
config.json fields and tensor names. The forward is the Llama one (models/llama).

A Phi-3 layer is a Llama layer whose q/k/v and gate/up matrices are stored fused
(`qkv_proj`, `gate_up_proj`: gate rows first), which is how our weights hold them anyway.
What differs is the rotary embedding: "longrope" scaling (old configs: "su"), an attention
factor on cos/sin, and on Phi-4-mini a partial rotary (the first R of each head's dims rotate,
pairing dim i with i + R/2; the rest pass through). The rotary kernels pair i with i + D/2, so
the loader reorders each q and k head's rows to put HF's pairs there and the pass-through dims
in the columns where the table holds cos 1, sin 0 (kernels/rope_table). q . k is the same sum
in any common order of dims, v is not touched, so the attention's output is HF's.
"""

from pathlib import Path

import numpy as np

from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.models.config import ModelConfig
from vtllm.models.registry import Family
from vtllm.models.weights import LayerWeights, ModelWeights, Weight

_DEFAULTS = {  # transformers' Phi3Config, for the fields hub configs may leave out
    "rope_theta": 10000.0,
    "original_max_position_embeddings": 4096,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "partial_rotary_factor": 1.0,
    "hidden_act": "silu",
}


def _rope(cfg: dict, head_dim: int, path: Path) -> tuple[float, dict | None, int]:
    """(theta, scaling, rotary_dim) from rope_parameters (transformers 5) or the older
    rope_theta / rope_scaling / partial_rotary_factor fields."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", cfg["rope_theta"]))
    partial = float(params.get("partial_rotary_factor", cfg["partial_rotary_factor"]))
    rotary_dim = int(head_dim * partial)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise UnsupportedModel(f"{path}: partial_rotary_factor {partial} (head_dim {head_dim})")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None, rotary_dim
    if kind not in ("longrope", "su"):
        raise UnsupportedModel(f"{path}: rope scaling {kind!r} is not supported (longrope)")
    original = int(
        params.get("original_max_position_embeddings", cfg["original_max_position_embeddings"])
    )
    scaling = {
        "rope_type": "longrope",
        "short_factor": [float(f) for f in params["short_factor"]],
        "long_factor": [float(f) for f in params["long_factor"]],
        "original_max_position_embeddings": original,
        # HF: without a factor, the ratio of the extended to the original context
        "factor": float(params.get("factor") or int(cfg["max_position_embeddings"]) / original),
        "attention_factor": params.get("attention_factor"),
    }
    for key in ("short_factor", "long_factor"):
        if len(scaling[key]) != rotary_dim // 2:
            raise UnsupportedModel(
                f"{path}: rope_scaling.{key} has {len(scaling[key])} values, "
                f"the rotary dims need {rotary_dim // 2}"
            )
    return theta, scaling, rotary_dim


def read_config(cfg: dict, fam: Family, path: Path) -> ModelConfig:
    cfg = {**_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    if cfg["hidden_act"] != "silu":
        raise UnsupportedModel(f"{path}: hidden_act {cfg['hidden_act']!r} (silu only)")
    hidden = int(cfg["hidden_size"])
    num_heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // num_heads)
    theta, scaling, rotary_dim = _rope(cfg, head_dim, path)
    layers = int(cfg["num_hidden_layers"])
    window = int(cfg.get("sliding_window") or 0)  # HF windows every layer when set
    eos = cfg.get("eos_token_id")
    return ModelConfig(
        architecture=fam.name,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=num_heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        head_dim=head_dim,
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        rms_norm_eps=float(cfg["rms_norm_eps"]),
        rope_theta=theta,
        rope_scaling=scaling,
        rotary_dim=0 if rotary_dim == head_dim else rotary_dim,
        max_position_embeddings=int(cfg["max_position_embeddings"]),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple([eos] if isinstance(eos, int) else (eos or [])),
        sliding_window=window,
        sliding_layers=(bool(window),) * layers,
    )


def rotary_row_order(head_dim: int, rotary_dim: int) -> np.ndarray:
    """int64 [head_dim]: for each of our dims, the HF dim it holds. HF pairs i with i + R/2
    over the first R dims; ours pairs i with i + D/2, and D/2 - R/2 pass-through dims sit in
    each half after the rotated ones."""
    half, pass_half = rotary_dim // 2, (head_dim - rotary_dim) // 2
    return np.concatenate(
        [
            np.arange(half),
            rotary_dim + np.arange(pass_half),
            half + np.arange(half),
            rotary_dim + pass_half + np.arange(pass_half),
        ]
    )


def _reorder_qk(w: Weight, config: ModelConfig) -> Weight:
    """The fused qkv matrix with each q and k head's rows in rotary_row_order."""
    dim = config.head_dim
    order = rotary_row_order(dim, config.rotary_dim)
    heads = config.num_heads + config.num_kv_heads
    rows = (np.arange(heads)[:, None] * dim + order).reshape(-1)
    rows = np.concatenate([rows, np.arange(heads * dim, w.shape[0])])  # v rows as they are
    return Weight(np.ascontiguousarray(w.data[rows]), w.qtype, w.shape)


def load_weights(tensors: dict, config: ModelConfig, directory: Path, matrix, vector):
    """ModelWeights from the directory's tensors; matrix / vector: the safetensors loader's
    readers by name (Weight, float32 vector)."""
    fused_rows = config.q_size + 2 * config.kv_size
    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        qkv = matrix(p + "self_attn.qkv_proj.weight")
        gate_up = matrix(p + "mlp.gate_up_proj.weight")
        if qkv.shape[0] != fused_rows or gate_up.shape[0] != 2 * config.intermediate_size:
            raise ModelLoadError(
                f"{directory}: layer {i}: qkv_proj {qkv.shape} / gate_up_proj {gate_up.shape} "
                f"do not fit the config ({fused_rows}, {2 * config.intermediate_size} rows)"
            )
        if config.rotary_dim:
            qkv = _reorder_qk(qkv, config)
        layers.append(
            LayerWeights(
                attn_norm=vector(p + "input_layernorm.weight"),
                qkv=[qkv],
                o=matrix(p + "self_attn.o_proj.weight"),
                ffn_norm=vector(p + "post_attention_layernorm.weight"),
                gate_up=[gate_up],
                down=matrix(p + "mlp.down_proj.weight"),
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
