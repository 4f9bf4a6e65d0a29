"""Tiny random Phi-3 checkpoints (and a windowed Mistral one), drawn from a seed in numpy, and
the e4m3 decode table from its bit formula.

Shared by tests/models/test_phi3.py, tests/models/test_fp8_checkpoints.py and
tests/goldens/make_phi3_references.py (which runs with torch + transformers, loads the same
arrays into HF and checks the e4m3 table against torch's), so no weights are committed: only
HF's logits of them. numpy only here: the reference venv has no vtllm dependencies.

What each config exercises, on prompts of 40 tokens and 32 more generated:
- phi3: Phi-3-mini-128k style: old "su" longrope config (short factors in force: 72 tokens stay
  under original_max_position_embeddings 128; max_position_embeddings 512 makes the attention
  factor sqrt(1 + ln 4 / ln 128)), sliding_window 12, untied head;
- phi4mini: Phi-4-mini style: partial_rotary_factor 0.75, longrope, tied embeddings, no window;
- mistral: a sliding_window of 10 on a Mistral config;
- qwen2window: Qwen2 with use_sliding_window and max_window_layers 1: layer 0 global, layers 1
  and 2 windowed (10), with the qkv bias.
"""

import hashlib

import numpy as np

SEED = 11
PROMPT_LEN, NEW_TOKENS = 40, 32

_BASE = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
}


def _factors(n: int, low: float, high: float, seed: int) -> list[float]:
    """Rising per-frequency divisors, as longrope's are, exact in float32."""
    x = np.sort(np.random.default_rng(seed).uniform(low, high, n)).astype(np.float32)
    return [float(v) for v in x]


CONFIGS = {
    "phi3": {
        **_BASE,
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "max_position_embeddings": 512,
        "original_max_position_embeddings": 128,
        "rope_scaling": {
            "type": "su",
            "short_factor": _factors(8, 1.0, 3.0, 1),
            "long_factor": _factors(8, 1.0, 24.0, 2),
        },
        "sliding_window": 12,
        "tie_word_embeddings": False,
    },
    "phi4mini": {
        **_BASE,
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "max_position_embeddings": 256,
        "original_max_position_embeddings": 128,
        "partial_rotary_factor": 0.75,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": _factors(6, 1.0, 3.0, 3),
            "long_factor": _factors(6, 1.0, 24.0, 4),
        },
        "sliding_window": None,
        "tie_word_embeddings": True,
    },
    "mistral": {
        **_BASE,
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "head_dim": 16,
        "max_position_embeddings": 256,
        "sliding_window": 10,
        "tie_word_embeddings": False,
    },
    "qwen2window": {
        **_BASE,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "max_position_embeddings": 256,
        "use_sliding_window": True,
        "sliding_window": 10,
        "max_window_layers": 1,
        "tie_word_embeddings": True,
    },
}


def tensor_specs(config: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(HF name, shape, law) of every tensor, in a fixed order."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    dim = hidden // heads
    phi = config["model_type"] == "phi3"
    specs = [("model.embed_tokens.weight", (config["vocab_size"], hidden), "embed")]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (hidden,), "norm"),
            (p + "post_attention_layernorm.weight", (hidden,), "norm"),
        ]
        if phi:  # fused: q, k, v rows; gate rows, then up rows
            specs.append((p + "self_attn.qkv_proj.weight", ((heads + 2 * kv) * dim, hidden), "mat"))
        else:
            specs += [
                (p + "self_attn.q_proj.weight", (heads * dim, hidden), "mat"),
                (p + "self_attn.k_proj.weight", (kv * dim, hidden), "mat"),
                (p + "self_attn.v_proj.weight", (kv * dim, hidden), "mat"),
            ]
        if config["model_type"] == "qwen2":
            specs += [
                (p + "self_attn.q_proj.bias", (heads * dim,), "bias"),
                (p + "self_attn.k_proj.bias", (kv * dim,), "bias"),
                (p + "self_attn.v_proj.bias", (kv * dim,), "bias"),
            ]
        specs.append((p + "self_attn.o_proj.weight", (hidden, heads * dim), "mat"))
        if phi:
            specs.append((p + "mlp.gate_up_proj.weight", (2 * inter, hidden), "mat"))
        else:
            specs += [
                (p + "mlp.gate_proj.weight", (inter, hidden), "mat"),
                (p + "mlp.up_proj.weight", (inter, hidden), "mat"),
            ]
        specs.append((p + "mlp.down_proj.weight", (hidden, inter), "mat"))
    specs.append(("model.norm.weight", (hidden,), "norm"))
    if not config["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (config["vocab_size"], hidden), "mat"))
    return specs


def tensors(name: str, seed: int = SEED) -> dict[str, np.ndarray]:
    """Embeddings N(0, 0.09), norms 1 + N(0, 0.01), biases N(0, 0.04), matrices N(0, 1/cols),
    float32."""
    rng = np.random.default_rng(seed)
    out = {}
    for tensor, shape, law in tensor_specs(CONFIGS[name]):
        x = rng.standard_normal(shape)
        if law == "norm":
            x = 1.0 + 0.1 * x
        elif law == "embed":
            x = 0.3 * x
        elif law == "bias":
            x = 0.2 * x
        else:
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


def e4m3_by_formula() -> np.ndarray:
    """float32 [256]: the value of each e4m3fn byte code S.EEEE.MMM (bias 7): normal
    (-1)^S 2^(E-7) (1 + M/8), subnormal (E = 0) (-1)^S 2^-6 (M/8), NaN for S.1111.111 and
    no infinities (S.1111.xxx below 111 are normal: up to 448)."""
    code = np.arange(256)
    sign = np.where(code >> 7, -1.0, 1.0)
    exp, man = (code >> 3) & 0xF, code & 0x7
    value = np.where(exp == 0, 2.0**-6 * (man / 8), 2.0 ** (exp - 7.0) * (1 + man / 8))
    value = sign * value
    value[(exp == 0xF) & (man == 0x7)] = np.nan
    return value.astype(np.float32)


def e4m3_digest() -> str:
    return hashlib.sha256(e4m3_by_formula().tobytes()).hexdigest()
