"""Qwen3-MoE and Mixtral checkpoints: config.json fields and tensor names (models/moe).

Hub configs lean on the transformers classes' defaults, so they are spelled out here. Experts
are read as the hub stores them, one matrix per expert and projection (Qwen3-MoE:
`mlp.experts.{e}.gate_proj / up_proj / down_proj`; Mixtral: `block_sparse_moe.experts.{e}.w1 /
w3 / w2`, gate / up / down), or as transformers 5 holds them in memory, one 3-D tensor per
layer (`mlp.experts.gate_up_proj` [experts, 2 * width, hidden], `mlp.experts.down_proj`);
either way as views of the file, never copied. GGUF files (llama.cpp's qwen3moe, and Mixtral
as llama with experts) take their expert fields from gguf_config_fields.
"""

from pathlib import Path

import numpy as np

from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.kernels import QType
from vtllm.models.config import ModelConfig
from vtllm.models.registry import Family
from vtllm.models.weights import LayerWeights, ModelWeights, MoeWeights, Weight

_DEFAULTS = {  # transformers' Qwen3MoeConfig / MixtralConfig
    "qwen3_moe": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "use_sliding_window": False,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 768,
        "num_experts_per_tok": 8,
        "num_experts": 128,
        "norm_topk_prob": False,
        "mlp_only_layers": [],
    },
    "mixtral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 4096 * 32,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "num_experts_per_tok": 2,
        "num_local_experts": 8,
    },
}
# fields of related configs (Qwen2-MoE, DeepSeek) that add a shared expert this forward lacks
_SHARED_EXPERT = ("shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts")
_QTYPES = {np.float32: QType.F32, np.float16: QType.F16, np.uint16: QType.BF16}


def _refuse(path: Path, what: str):
    raise UnsupportedModel(f"{path}: {what} is not supported")


def _rope(cfg: dict, path: Path) -> tuple[float, dict | None]:
    """(theta, scaling) from rope_parameters (transformers 5) or rope_theta / rope_scaling."""
    scaling = cfg.get("rope_parameters") or cfg.get("rope_scaling") or None
    theta = float((scaling or {}).get("rope_theta", cfg["rope_theta"]))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind not in ("default", "linear", "llama3"):
        _refuse(path, f"rope scaling {kind!r}")
    if kind == "default":
        return theta, None
    return theta, {k: v for k, v in scaling.items() if k != "rope_theta"} | {"rope_type": kind}


def read_config(raw: dict, fam: Family, path: Path) -> ModelConfig:
    cfg = {**_DEFAULTS[fam.name], **{k: v for k, v in raw.items() if v is not None}}
    if cfg["hidden_act"] != "silu":
        _refuse(path, f"hidden_act {cfg['hidden_act']!r} (silu only)")
    if cfg.get("attention_bias"):
        _refuse(path, "attention_bias (q/k/v/o projection biases)")
    for key in _SHARED_EXPERT:
        if cfg.get(key):
            _refuse(path, f"a shared expert ({key}={cfg[key]})")
    layers = int(cfg["num_hidden_layers"])
    if fam.name == "mixtral":
        num_experts, renormalize = int(cfg["num_local_experts"]), True
        width, step, dense = int(cfg["intermediate_size"]), 1, ()
        window = cfg.get("sliding_window")  # a window as long as the context never binds
        if window and window < int(cfg["max_position_embeddings"]):
            _refuse(path, f"sliding_window {window} (windowed attention)")
    else:
        num_experts, renormalize = int(cfg["num_experts"]), bool(cfg["norm_topk_prob"])
        width, step = int(cfg["moe_intermediate_size"]), int(cfg["decoder_sparse_step"])
        dense = tuple(int(i) for i in cfg["mlp_only_layers"])
        if cfg["use_sliding_window"]:
            _refuse(path, "use_sliding_window (windowed attention)")
        if step < 1:
            _refuse(path, f"decoder_sparse_step {step}")
    top_k = int(cfg["num_experts_per_tok"])
    if num_experts and not 1 <= top_k <= num_experts:
        _refuse(path, f"num_experts_per_tok {top_k} of {num_experts} experts")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    theta, scaling = _rope(cfg, path)
    eos = cfg.get("eos_token_id")
    return ModelConfig(
        architecture=fam.name,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(cfg["num_key_value_heads"] or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        rms_norm_eps=float(cfg["rms_norm_eps"]),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg["max_position_embeddings"]),
        tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
        qk_norm=fam.qk_norm,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple([eos] if isinstance(eos, int) else (eos or [])),
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=width,
        norm_topk_prob=renormalize,
        decoder_sparse_step=step,
        mlp_only_layers=dense,
    )


def hub_block(config: ModelConfig, layer: int) -> str:
    """A layer's MoE block prefix under the hub's names."""
    block = "block_sparse_moe." if config.architecture == "mixtral" else "mlp."
    return f"model.layers.{layer}.{block}"


def hub_names(config: ModelConfig, block: str) -> tuple[str, list[tuple[str, str, str]]]:
    """The router's name and each expert's (gate, up, down) names under a MoE block prefix,
    one matrix per expert as the hub stores them."""
    if block.endswith("block_sparse_moe."):
        names, suffix = ("w1", "w3", "w2"), ""
    else:
        names, suffix = ("gate", "up", "down"), "_proj"
    experts = [
        tuple(f"{block}experts.{e}.{name}{suffix}.weight" for name in names)
        for e in range(config.num_experts)
    ]
    return block + "gate.weight", experts


def _experts(tensors: dict, config: ModelConfig, i: int, matrix, directory: Path) -> MoeWeights:
    """Layer i's router and experts, from whichever layout the checkpoint has."""
    block = hub_block(config, i)
    if f"model.layers.{i}.mlp.gate.weight" in tensors:  # Mixtral as transformers 5 names it
        block = f"model.layers.{i}.mlp."
    n = config.num_experts
    fused = tensors.get(block + "experts.gate_up_proj")
    if fused is not None:  # transformers 5's in-memory layout, saved as is
        down = tensors.get(block + "experts.down_proj")
        if down is None:
            raise ModelLoadError(f"{directory}: tensor {block}experts.down_proj is missing")
        if fused.ndim != 3 or fused.shape[0] != n or down.shape[0] != n:
            raise ModelLoadError(
                f"{directory}: {block}experts: {n} experts expected, got {fused.shape}"
            )
        gate_up = [[_view(fused[e])] for e in range(n)]
        return MoeWeights(matrix(block + "gate.weight"), gate_up, [_view(d) for d in down])
    router, experts = hub_names(config, block)
    gate_up = [[matrix(gate), matrix(up)] for gate, up, _ in experts]
    return MoeWeights(matrix(router), gate_up, [matrix(down) for *_, down in experts])


def _view(data: np.ndarray) -> Weight:
    return Weight(data, _QTYPES[data.dtype.type], (int(data.shape[0]), int(data.shape[1])))


def load_weights(tensors: dict, config: ModelConfig, directory: Path, matrix, vector):
    """ModelWeights from the directory's tensors; matrix / vector: the safetensors loader's
    readers by name (Weight, float32 vector)."""
    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        moe = _experts(tensors, config, i, matrix, directory) if config.is_moe_layer(i) else None
        layers.append(
            LayerWeights(
                attn_norm=vector(p + "input_layernorm.weight"),
                qkv=[matrix(a + f"{n}_proj.weight") for n in "qkv"],
                o=matrix(a + "o_proj.weight"),
                ffn_norm=vector(p + "post_attention_layernorm.weight"),
                gate_up=[] if moe else [matrix(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")],
                down=None if moe else matrix(p + "mlp.down_proj.weight"),
                q_norm=vector(a + "q_norm.weight") if config.qk_norm else None,
                k_norm=vector(a + "k_norm.weight") if config.qk_norm else None,
                moe=moe,
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


def gguf_config_fields(field, arch: str, names: set[str], num_layers: int, path: Path) -> dict:
    """ModelConfig's expert fields from GGUF metadata as llama.cpp writes it (expert_count,
    expert_used_count, expert_feed_forward_length); {} for a file without experts. field:
    key -> value or None. A layer without a router (ffn_gate_inp) keeps a dense MLP."""
    num_experts = int(field(f"{arch}.expert_count") or 0)
    if not num_experts:
        return {}
    if field(f"{arch}.expert_shared_count") or any("_shexp." in name for name in names):
        _refuse(path, "a shared expert")
    gating = field(f"{arch}.expert_gating_func")
    if gating not in (None, 1):  # llama.cpp's ExpertGatingFuncType.SOFTMAX
        _refuse(path, f"expert_gating_func {gating} (softmax only)")
    if field(f"{arch}.expert_weights_scale") not in (None, 1.0):
        _refuse(path, f"expert_weights_scale {field(f'{arch}.expert_weights_scale')}")
    top_k = field(f"{arch}.expert_used_count")
    if top_k is None:
        raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.expert_used_count")
    if not 1 <= int(top_k) <= num_experts:
        _refuse(path, f"expert_used_count {top_k} of {num_experts} experts")
    width = field(f"{arch}.expert_feed_forward_length") or field(f"{arch}.feed_forward_length")
    norm = field(f"{arch}.expert_weights_norm")
    return {
        "num_experts": num_experts,
        "num_experts_per_tok": int(top_k),
        "moe_intermediate_size": int(width),
        # llama.cpp renormalizes the top-k weights of both families unless told otherwise
        "norm_topk_prob": True if norm is None else bool(norm),
        "mlp_only_layers": tuple(
            i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" not in names
        ),
    }
