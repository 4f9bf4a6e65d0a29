"""Tiny random Qwen3-MoE and Mixtral checkpoints, drawn from a seed in numpy.

Shared by tests/models/test_moe.py and tests/goldens/make_moe_references.py (which runs with
torch + transformers and loads the same arrays into HF from a safetensors file under these
hub names), so no weights are committed: only HF's logits of them. numpy only here: the
reference venv has no vtllm dependencies.

The configs cover what differs between the two: Qwen3-MoE's q/k norm, its dense layers
(`mlp_only_layers`, `decoder_sparse_step`), its own expert width (`moe_intermediate_size`)
and `norm_topk_prob` both ways; Mixtral's `block_sparse_moe` names with w1 / w2 / w3 and its
always renormalized top-k. Norm weights 1 + N(0, 0.01), matrices N(0, 1/cols), embeddings
N(0, 0.09) (N(0, 0.01) tied): the layers' branches outweigh the embedding (a tied head would
otherwise mostly predict the input token), and router logits come out near N(0, 1), so most
tokens' top-k are clear of ties while the experts still share the tokens.
"""

import numpy as np

from tests.models.gemma_tiny import digest

__all__ = ["CONFIGS", "NEW_TOKENS", "PROMPT_LEN", "SEED", "digest", "prompt", "tensors"]

SEED = 11
PROMPT_LEN, NEW_TOKENS = 40, 32

_COMMON = {
    "vocab_size": 320,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}

CONFIGS = {
    "qwen3_moe": {  # hub style (Qwen3-30B-A3B's fields); layer 1 keeps a dense MLP
        **_COMMON,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "head_dim": 16,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
    },
    "qwen3_moe_step2": {  # every other layer sparse (0 and 2 dense), raw top-k weights, tied
        **_COMMON,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "head_dim": 16,
        "intermediate_size": 80,
        "moe_intermediate_size": 24,
        "num_hidden_layers": 4,
        "num_experts": 6,
        "num_experts_per_tok": 3,
        "norm_topk_prob": False,
        "decoder_sparse_step": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    },
    "mixtral": {  # hub style (Mixtral-8x7B's fields)
        **_COMMON,
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "router_jitter_noise": 0.0,
        "tie_word_embeddings": False,
    },
}


def sparse_layers(config: dict) -> list[bool]:
    """Per layer, whether it routes to experts (transformers' rule for Qwen3-MoE)."""
    layers = config["num_hidden_layers"]
    if config["model_type"] == "mixtral":
        return [True] * layers
    step, dense = config.get("decoder_sparse_step", 1), config.get("mlp_only_layers") or []
    return [i not in dense and (i + 1) % step == 0 for i in range(layers)]


def tensor_specs(config: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(HF hub name, shape, law) of every tensor, in a fixed order."""
    hidden, heads, kv = (
        config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")
    )
    dim = config.get("head_dim") or hidden // heads
    mixtral = config["model_type"] == "mixtral"
    experts = config["num_local_experts"] if mixtral else config["num_experts"]
    inter = config["intermediate_size"] if mixtral else config["moe_intermediate_size"]
    specs = [("model.embed_tokens.weight", (config["vocab_size"], hidden), "embed")]
    for i, sparse in enumerate(sparse_layers(config)):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (hidden,), "norm"),
            (p + "post_attention_layernorm.weight", (hidden,), "norm"),
            (p + "self_attn.q_proj.weight", (heads * dim, hidden), "mat"),
            (p + "self_attn.k_proj.weight", (kv * dim, hidden), "mat"),
            (p + "self_attn.v_proj.weight", (kv * dim, hidden), "mat"),
            (p + "self_attn.o_proj.weight", (hidden, heads * dim), "mat"),
        ]
        if not mixtral:
            specs.append((p + "self_attn.q_norm.weight", (dim,), "norm"))
            specs.append((p + "self_attn.k_norm.weight", (dim,), "norm"))
        if not sparse:
            dense = config["intermediate_size"]
            specs += [
                (p + "mlp.gate_proj.weight", (dense, hidden), "mat"),
                (p + "mlp.up_proj.weight", (dense, hidden), "mat"),
                (p + "mlp.down_proj.weight", (hidden, dense), "mat"),
            ]
            continue
        m = p + ("block_sparse_moe." if mixtral else "mlp.")
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        specs.append((m + "gate.weight", (experts, hidden), "mat"))
        for e in range(experts):
            gate, up, down = (f"{m}experts.{e}.{n}.weight" for n in names)
            specs += [
                (gate, (inter, hidden), "mat"),
                (up, (inter, hidden), "mat"),
                (down, (hidden, inter), "mat"),
            ]
    specs.append(("model.norm.weight", (hidden,), "norm"))
    if not config["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (config["vocab_size"], hidden), "mat"))
    return specs


def tensors(name: str, seed: int = SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for tensor, shape, law in tensor_specs(CONFIGS[name]):
        x = rng.standard_normal(shape)
        if law == "norm":
            x = 1.0 + 0.1 * x
        elif law == "embed":  # a tied head reads it too: smaller, or it echoes the input
            x = (0.1 if CONFIGS[name]["tie_word_embeddings"] else 0.3) * x
        else:
            x = x / np.sqrt(shape[1])
        out[tensor] = x.astype(np.float32)
    return out


def prompt(name: str, seed: int = SEED) -> list[int]:
    vocab = CONFIGS[name]["vocab_size"]
    return np.random.default_rng(seed + 1).integers(3, vocab, PROMPT_LEN).tolist()
