"""Synthetic checkpoints: HF-format directories with random weights at real or tiny shapes.

Loadable by vtllm and by HF transformers. `peaked=True` scales the output head so that logits
have wide margins and greedy paths agree across implementations.
"""

import json
import struct
from pathlib import Path

import numpy as np


def _experts(num: int, top_k: int, width: int) -> dict:
    """A Qwen3-MoE shape's expert fields (hf_config writes them; norm_topk_prob as the hub)."""
    return {"num_experts": num, "num_experts_per_tok": top_k, "moe_intermediate_size": width}


SHAPES = {
    # name: (architecture, hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, extra)
    "tiny": ("llama", 64, 2, 4, 2, 16, 128, 512, {}),
    "tiny-qwen3": ("qwen3", 64, 2, 4, 2, 16, 128, 512, {}),
    "tiny-qwen2": ("qwen2", 64, 2, 4, 2, 16, 128, 512, {}),
    "tiny-qwen3-d32": ("qwen3", 64, 2, 4, 2, 32, 128, 512, {}),  # heads of a whole warp
    "tiny-qwen3-moe": ("qwen3_moe", 64, 2, 4, 2, 16, 128, 512, _experts(8, 2, 32)),
    "smollm2-135m": ("llama", 576, 30, 9, 3, 64, 1536, 49152, {"rope_theta": 100000.0}),
    "qwen3-0.6b": ("qwen3", 1024, 28, 16, 8, 128, 3072, 151936, {"rope_theta": 1000000.0}),
    # every layer routed: 128 experts of width 768, 8 a token (intermediate: the dense width)
    "qwen3-30b-a3b": (
        "qwen3_moe",
        2048,
        48,
        32,
        4,
        128,
        6144,
        151936,
        {"rope_theta": 1000000.0, **_experts(128, 8, 768)},
    ),
    # Gemma 3 4B's text model: five of six layers windowed (1,024 keys) with their own rope
    # base, the global ones linearly scaled; gelu-tanh MLP, q/k norm, four norms a layer, tied
    "gemma3-4b": (
        "gemma3",
        2560,
        34,
        8,
        4,
        256,
        10240,
        262208,
        {
            "rope_theta": 1000000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "rope_local_base_freq": 10000.0,
            "query_pre_attn_scalar": 256,
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
        },
    ),
    "llama3-8b": (
        "llama",
        4096,
        32,
        32,
        8,
        128,
        14336,
        128256,
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
    ),
}
_HF_CLASS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
_GEMMA3 = (  # hf_config copies these from a gemma3 shape's extra fields
    "rope_local_base_freq",
    "query_pre_attn_scalar",
    "sliding_window",
    "sliding_window_pattern",
)


def hf_config(
    shape: str,
    *,
    max_position_embeddings: int = 4096,
    tie: bool = False,
    layers: int | None = None,
    vocab: int | None = None,
) -> dict:
    """The shape's HF config; layers overrides its depth (a quick profile of a big shape),
    vocab its vocabulary (a cheaper head where the tokenizer is not used)."""
    arch, hidden, num_layers, heads, kv_heads, head_dim, inter, shape_vocab, extra = SHAPES[shape]
    layers = num_layers if layers is None else layers
    vocab = shape_vocab if vocab is None else vocab
    experts = {}
    if "num_experts" in extra:
        experts = {
            k: extra[k] for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
        }
        experts.update(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    gemma = {}
    if arch == "gemma3":
        gemma = {k: extra[k] for k in _GEMMA3}
        gemma.update(
            hidden_activation="gelu_pytorch_tanh",
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
        )
        tie = True  # Gemma's head is its embedding
    return {
        **experts,
        **gemma,
        "architectures": [_HF_CLASS[arch]],
        "model_type": "gemma3_text" if arch == "gemma3" else arch,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": extra.get("rope_theta", 10000.0),
        "rope_scaling": extra.get("rope_scaling"),
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie,
        "hidden_act": "silu",
        "attention_bias": arch == "qwen2",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }


def tensor_specs(config: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) of every tensor, in file order; kind picks the random law."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, dim = (
        config[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")
    )
    vocab = config["vocab_size"]
    specs = [("model.embed_tokens.weight", (vocab, hidden), "embed")]
    gemma = config["model_type"] == "gemma3_text"
    norm = "offset" if gemma else "norm"  # Gemma multiplies by 1 + w
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (hidden,), norm),
            (p + "post_attention_layernorm.weight", (hidden,), norm),
            (p + "self_attn.q_proj.weight", (heads * dim, hidden), "mat"),
            (p + "self_attn.k_proj.weight", (kv_heads * dim, hidden), "mat"),
            (p + "self_attn.v_proj.weight", (kv_heads * dim, hidden), "mat"),
            (p + "self_attn.o_proj.weight", (hidden, heads * dim), "mat"),
        ]
        if config["model_type"] == "qwen2":
            for name, n in (("q", heads * dim), ("k", kv_heads * dim), ("v", kv_heads * dim)):
                specs.append((p + f"self_attn.{name}_proj.bias", (n,), "bias"))
        if config["model_type"] in ("qwen3", "qwen3_moe", "gemma3_text"):
            specs.append((p + "self_attn.q_norm.weight", (dim,), norm))
            specs.append((p + "self_attn.k_norm.weight", (dim,), norm))
        if gemma:
            specs.append((p + "pre_feedforward_layernorm.weight", (hidden,), norm))
            specs.append((p + "post_feedforward_layernorm.weight", (hidden,), norm))
        if config.get("num_experts"):  # the hub's names: the router, then each expert
            width = config["moe_intermediate_size"]
            specs.append((p + "mlp.gate.weight", (config["num_experts"], hidden), "mat"))
            for e in range(config["num_experts"]):
                q = f"{p}mlp.experts.{e}."
                specs += [
                    (q + "gate_proj.weight", (width, hidden), "mat"),
                    (q + "up_proj.weight", (width, hidden), "mat"),
                    (q + "down_proj.weight", (hidden, width), "mat"),
                ]
            continue
        specs += [
            (p + "mlp.gate_proj.weight", (inter, hidden), "mat"),
            (p + "mlp.up_proj.weight", (inter, hidden), "mat"),
            (p + "mlp.down_proj.weight", (hidden, inter), "mat"),
        ]
    specs.append(("model.norm.weight", (hidden,), norm))
    if not config["tie_word_embeddings"]:
        specs.append(("lm_head.weight", (vocab, hidden), "head"))
    return specs


def _draw(rng, kind: str, shape, *, peaked: bool, dtype=np.float64) -> np.ndarray:
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype)).astype(np.float32)
    if kind == "offset":
        return (0.1 * rng.standard_normal(shape, dtype)).astype(np.float32)
    if kind == "bias":
        return (0.1 * rng.standard_normal(shape, dtype)).astype(np.float32)
    x = rng.standard_normal(shape, dtype)
    if kind == "embed":
        return x.astype(np.float32)
    x *= (8.0 if peaked and kind == "head" else 1.0) / np.sqrt(shape[1])
    return x.astype(np.float32)


def random_weights(config: dict, *, seed: int = 0, peaked: bool = False) -> dict[str, np.ndarray]:
    """Every tensor in memory (float32). Embeddings N(0, 1), matrices N(0, 1/cols), norms
    1 + N(0, 0.01); `peaked` scales the untied output head by 8."""
    rng = np.random.default_rng(seed)
    return {
        name: _draw(rng, kind, shape, peaked=peaked) for name, shape, kind in tensor_specs(config)
    }


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, rounding to nearest even."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def save_safetensors(path: Path, tensors: dict[str, np.ndarray], *, bf16: bool = False) -> None:
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = to_bf16_bits(array) if bf16 else np.ascontiguousarray(array, np.float32)
        raw = data.tobytes()
        header[name] = {
            "dtype": "BF16" if bf16 else "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    meta = json.dumps(header).encode()
    meta += b" " * (-len(meta) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(meta)))
        f.write(meta)
        for raw in blobs:
            f.write(raw)


def write_random_safetensors(
    path: Path, config: dict, *, seed: int, peaked: bool, bf16: bool
) -> None:
    """random_weights' laws, drawn in float32 and written one tensor at a time, so a real-size
    checkpoint (Llama-3.1-8B: 16 GB in bf16) never sits in memory whole."""
    specs = tensor_specs(config)
    itemsize = 2 if bf16 else 4
    header, offset = {}, 0
    for name, shape, _ in specs:
        size = int(np.prod(shape)) * itemsize
        header[name] = {
            "dtype": "BF16" if bf16 else "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    meta = json.dumps(header).encode()
    meta += b" " * (-len(meta) % 8)
    rng = np.random.default_rng(seed)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(meta)))
        f.write(meta)
        for _name, shape, kind in specs:
            x = _draw(rng, kind, shape, peaked=peaked, dtype=np.float32)
            f.write((to_bf16_bits(x) if bf16 else x).tobytes())


def byte_tokenizer_json(vocab_size: int) -> dict:
    """A byte-level BPE with no merges: 3 specials, 256 bytes, then filler tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(byte_chars):
        vocab[ch] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<filler_{len(vocab)}>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return json.loads(tok.to_str())


def write_checkpoint(
    out: Path,
    shape: str,
    *,
    seed: int = 0,
    bf16: bool = False,
    peaked: bool = False,
    tie: bool = False,
    max_position_embeddings: int = 4096,
    layers: int | None = None,
    vocab: int | None = None,
) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(
        shape, max_position_embeddings=max_position_embeddings, tie=tie, layers=layers, vocab=vocab
    )
    config["torch_dtype"] = "bfloat16" if bf16 else "float32"
    write_random_safetensors(out / "model.safetensors", config, seed=seed, peaked=peaked, bf16=bf16)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(config["vocab_size"])))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": max_position_embeddings,
            }
        )
    )
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    return out
