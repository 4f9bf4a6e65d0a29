"""A plain numpy float64 Llama-family forward over a whole sequence, HF semantics.

Independent of vtllm's loader, kernels and paging: it reads the safetensors files itself.
"""

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _inv_freq(cfg):
    dim = cfg["head_dim"]
    inv = 1.0 / cfg["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    scaling = cfg.get("rope_scaling")
    if scaling and scaling.get("rope_type") == "llama3":
        factor, low, high = (
            scaling["factor"],
            scaling["low_freq_factor"],
            scaling["high_freq_factor"],
        )
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * np.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old / high) & (wavelen <= old / low)
        inv = np.where(is_mid, mid, scaled)
    elif scaling and scaling.get("rope_type") == "linear":
        inv = inv / scaling["factor"]
    return inv


def reference_logits(directory: Path, ids: list[int]) -> np.ndarray:
    cfg = json.loads((Path(directory) / "config.json").read_text())
    w = {
        k: v.astype(np.float64)
        for k, v in load_file(str(Path(directory) / "model.safetensors")).items()
    }
    eps, dim = cfg["rms_norm_eps"], cfg["head_dim"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    n = len(ids)
    freqs = np.outer(np.arange(n, dtype=np.float64), _inv_freq(cfg))
    cos = np.cos(np.concatenate([freqs, freqs], -1))[:, None, :]
    sin = np.sin(np.concatenate([freqs, freqs], -1))[:, None, :]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    h = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = _rms(h, w[p + "input_layernorm.weight"], eps)
        proj = {}
        for name in "qkv":
            y = x @ w[p + f"self_attn.{name}_proj.weight"].T
            if p + f"self_attn.{name}_proj.bias" in w:
                y = y + w[p + f"self_attn.{name}_proj.bias"]
            proj[name] = y.reshape(n, -1, dim)
        q, k, v = proj["q"], proj["k"], proj["v"]
        if p + "self_attn.q_norm.weight" in w:
            q = _rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        group = heads // kv_heads
        out = np.empty_like(q)
        for hd in range(heads):
            scores = q[:, hd] @ k[:, hd // group].T / np.sqrt(dim) + mask
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out[:, hd] = probs @ v[:, hd // group]
        h = h + out.reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
        x = _rms(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = x @ w[p + "mlp.gate_proj.weight"].T
        up = x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = _rms(h, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T
