"""Tiny random Gemma 2 and Gemma 3 checkpoints, drawn from a seed in numpy.

Shared by tests/models/test_gemma.py and tests/goldens/make_family_references.py (which runs
with torch + transformers and loads the same arrays into HF), so no weights are committed: only
HF's logits of them. numpy only here: the reference venv has no vtllm dependencies.

The laws make every twist count: embeddings N(0, 0.09) (scaled by sqrt(hidden) in the forward),
norm offsets N(0, 0.01), matrices N(0, 1/cols), and the post-norms' offsets 2 + N(0, 0.01), so
the layers' branches outweigh the embedding in the residual stream (else the tied head mostly
predicts the input token). Gemma 2's caps are small enough to bite on these scores and logits.
Windows of 8 against prompts of 40 tokens: most keys of a sliding layer are out of its window.
"""

import hashlib

import numpy as np

SEED = 7
PROMPT_LEN, NEW_TOKENS = 40, 32

CONFIGS = {
    "gemma2": {  # hub style: no layer_types, rope_theta; HF alternates local, global
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "query_pre_attn_scalar": 24,
        "sliding_window": 8,
        "attn_logit_softcapping": 1.5,
        "final_logit_softcapping": 10.0,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    },
    "gemma3": {  # hub style (gemma-3-4b's text): local base, linear scaling on global layers
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 7,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "query_pre_attn_scalar": 16,
        "sliding_window": 8,
        "sliding_window_pattern": 6,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    },
}


def tensor_specs(config: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(HF name, shape, law) of every tensor, in a fixed order."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv, dim = (config[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim"))
    specs = [("model.embed_tokens.weight", (config["vocab_size"], hidden), "embed")]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            law = "post_norm" if norm.startswith("post") else "norm"
            specs.append((p + f"{norm}_layernorm.weight", (hidden,), law))
        specs += [
            (p + "self_attn.q_proj.weight", (heads * dim, hidden), "mat"),
            (p + "self_attn.k_proj.weight", (kv * dim, hidden), "mat"),
            (p + "self_attn.v_proj.weight", (kv * dim, hidden), "mat"),
            (p + "self_attn.o_proj.weight", (hidden, heads * dim), "mat"),
        ]
        if config["model_type"] == "gemma3_text":
            specs.append((p + "self_attn.q_norm.weight", (dim,), "norm"))
            specs.append((p + "self_attn.k_norm.weight", (dim,), "norm"))
        specs += [
            (p + "mlp.gate_proj.weight", (inter, hidden), "mat"),
            (p + "mlp.up_proj.weight", (inter, hidden), "mat"),
            (p + "mlp.down_proj.weight", (hidden, inter), "mat"),
        ]
    specs.append(("model.norm.weight", (hidden,), "norm"))
    return specs


def tensors(name: str, seed: int = SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for tensor, shape, law in tensor_specs(CONFIGS[name]):
        x = rng.standard_normal(shape)
        if law == "norm":  # HF stores the offset from 1
            x = 0.1 * x
        elif law == "post_norm":
            x = 2.0 + 0.1 * x
        elif law == "embed":
            x = 0.3 * x
        elif law == "mat":
            x = x / np.sqrt(shape[1])
        out[tensor] = x.astype(np.float32)
    return out


def digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over names and bytes: the test checks it draws what the references came from."""
    h = hashlib.sha256()
    for key in sorted(arrays):
        h.update(key.encode())
        h.update(np.ascontiguousarray(arrays[key]).tobytes())
    return h.hexdigest()


def prompt(name: str, seed: int = SEED) -> list[int]:
    vocab = CONFIGS[name]["vocab_size"]
    return np.random.default_rng(seed + 1).integers(3, vocab, PROMPT_LEN).tolist()
