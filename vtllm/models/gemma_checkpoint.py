"""Gemma 2 and Gemma 3 HF checkpoints: config.json fields and tensor names (models/gemma).

Hub configs lean on the transformers classes' defaults (a Gemma 3 multimodal config's
text_config names a handful of fields), so the defaults are spelled out here. Norm weights are
stored as offsets from 1 (HF computes x * (1 + w)); they are loaded as 1 + w in float32, which
is what HF multiplies by, so the forward runs the plain RMSNorm.
"""

from pathlib import Path

import numpy as np

from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.models.config import ModelConfig
from vtllm.models.registry import Family
from vtllm.models.weights import LayerWeights, ModelWeights

_DEFAULTS = {  # transformers' Gemma2Config / Gemma3TextConfig
    "gemma2": {
        "vocab_size": 256000,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
    },
    "gemma3": {
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    },
}
_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")
# where the text model's tensors sit: Gemma*ForCausalLM, then Gemma3ForConditionalGeneration
# as transformers >= 4.52 and older ones save it
_PREFIXES = ("model.", "model.language_model.", "language_model.model.")


def _rope(cfg: dict, path: Path) -> tuple[float, dict | None, float]:
    """(global theta, global scaling, local theta): from rope_parameters (transformers 5's
    layout, per layer type for Gemma 3) or rope_theta / rope_scaling / rope_local_base_freq."""
    params = cfg.get("rope_parameters")
    if params and "full_attention" in params:
        full, local = params["full_attention"], params.get("sliding_attention") or {}
        theta, scaling = full["rope_theta"], full
        local_theta = local.get("rope_theta", cfg["rope_local_base_freq"])
        if local.get("rope_type", "default") != "default":
            raise UnsupportedModel(f"{path}: local rope {local['rope_type']!r} is not supported")
    elif params:
        theta, scaling, local_theta = params["rope_theta"], params, params["rope_theta"]
    else:
        theta, scaling = cfg["rope_theta"], cfg.get("rope_scaling")
        local_theta = cfg.get("rope_local_base_freq", theta)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind not in ("default", "linear"):
        raise UnsupportedModel(f"{path}: rope scaling {kind!r} is not supported")
    scaling = (
        {"rope_type": "linear", "factor": float(scaling["factor"])} if kind != "default" else None
    )
    return float(theta), scaling, float(local_theta)


def read_config(raw: dict, fam: Family, path: Path) -> ModelConfig:
    top = raw
    if "text_config" in raw:  # Gemma3ForConditionalGeneration: the text model alone
        raw = raw["text_config"] or {}
    cfg = {**_DEFAULTS[fam.name], **{k: v for k, v in raw.items() if v is not None}}
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if key in raw:  # an explicit null turns a default cap off
            cfg[key] = raw[key]
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or _ACTIVATIONS[0]
    if act not in _ACTIVATIONS:
        raise UnsupportedModel(f"{path}: hidden_activation {act!r} (gelu tanh only)")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModel(f"{path}: bidirectional attention is not supported")
    layers = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is None:  # Gemma 2: every other layer; Gemma 3: 5 local to 1 global
        every = 2 if fam.name == "gemma2" else int(cfg["sliding_window_pattern"])
        types = [
            "sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)
        ]
    if len(types) != layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise UnsupportedModel(f"{path}: layer_types {types} are not supported")
    theta, scaling, local_theta = _rope(cfg, path)
    eos = top.get("eos_token_id", cfg.get("eos_token_id"))
    return ModelConfig(
        architecture=fam.name,
        hidden_size=int(cfg["hidden_size"]),
        num_layers=layers,
        num_heads=int(cfg["num_attention_heads"]),
        num_kv_heads=int(cfg["num_key_value_heads"]),
        head_dim=int(cfg["head_dim"]),
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg["max_position_embeddings"]),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        qkv_bias=bool(cfg.get("attention_bias", False)),
        qk_norm=fam.qk_norm,
        bos_token_id=top.get("bos_token_id", cfg.get("bos_token_id")),
        eos_token_ids=tuple([eos] if isinstance(eos, int) else (eos or [])),
        sliding_window=int(cfg["sliding_window"] or 0),
        sliding_layers=tuple(t == "sliding_attention" for t in types),
        rope_local_theta=local_theta if local_theta != theta else 0.0,
        query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]),
        attn_logit_softcap=float(cfg["attn_logit_softcapping"] or 0.0),
        final_logit_softcap=float(cfg["final_logit_softcapping"] or 0.0),
    )


def load_weights(tensors: dict, config: ModelConfig, directory: Path, matrix, vector):
    """ModelWeights from the directory's tensors; matrix / vector: the safetensors loader's
    readers by name (Weight, float32 vector)."""
    prefix = next((p for p in _PREFIXES if p + "embed_tokens.weight" in tensors), None)
    if prefix is None:
        raise ModelLoadError(f"{directory}: tensor model.embed_tokens.weight is missing")

    def norm(name: str) -> np.ndarray:
        return vector(name) + np.float32(1.0)

    layers = []
    for i in range(config.num_layers):
        p = f"{prefix}layers.{i}."
        a = p + "self_attn."
        bias = None
        if config.qkv_bias:
            bias = np.concatenate([vector(a + f"{n}_proj.bias") for n in "qkv"])
        layers.append(
            LayerWeights(
                attn_norm=norm(p + "input_layernorm.weight"),
                qkv=[matrix(a + f"{n}_proj.weight") for n in "qkv"],
                o=matrix(a + "o_proj.weight"),
                ffn_norm=norm(p + "pre_feedforward_layernorm.weight"),
                gate_up=[matrix(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")],
                down=matrix(p + "mlp.down_proj.weight"),
                qkv_bias=bias,
                q_norm=norm(a + "q_norm.weight") if config.qk_norm else None,
                k_norm=norm(a + "k_norm.weight") if config.qk_norm else None,
                post_attn_norm=norm(p + "post_attention_layernorm.weight"),
                post_ffn_norm=norm(p + "post_feedforward_layernorm.weight"),
            )
        )
    embed = matrix(prefix + "embed_tokens.weight")
    head = next(
        (n for n in ("lm_head.weight", "language_model.lm_head.weight") if n in tensors), None
    )
    tied = config.tie_word_embeddings or head is None
    return ModelWeights(
        embed=embed,
        layers=layers,
        final_norm=norm(prefix + "norm.weight"),
        lm_head=embed if tied else matrix(head),
    )
