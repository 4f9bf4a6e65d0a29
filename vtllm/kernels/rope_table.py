"""The rotary embedding's cos/sin table, built on the host in numpy for both backends.

Backend-neutral (numpy only): kernels.cpu.rope rotates by it as is, kernels.cuda.rope by the same
float32 table copied to the device once, so neither backend imports the other.
"""

import math

import numpy as np


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict | None = None, *, context_len: int | None = None
) -> np.ndarray:
    """float64 [head_dim/2] inverse frequencies, as HF transformers derives them; head_dim is
    the rotated width (Phi's partial rotary: a fraction of the head). context_len: the longest
    sequence the table serves (longrope picks its factors by it)."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64) / head_dim))
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "longrope":  # HF _compute_longrope_parameters (Phi-3)
        return inv_freq / np.asarray(_longrope_factors(scaling, context_len), np.float64)
    if kind == "llama3":  # HF _compute_llama3_parameters
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        llama = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, llama)
    raise ValueError(f"rope_cos_sin: unsupported rope scaling type {kind!r}")


def _longrope_factors(scaling: dict, context_len: int | None) -> list:
    """Per frequency divisors of longrope. HF switches the whole sequence to the long factors
    once it grows past original_max_position_embeddings; over a paged KV cache the keys already
    written were rotated with the short ones and would all need rotating again, so (as vLLM
    does) the table is chosen once, by the longest sequence the engine serves: the short
    factors keep HF's numbers exactly on every sequence when that fits the original window."""
    long = context_len is not None and context_len > scaling["original_max_position_embeddings"]
    return scaling["long_factor" if long else "short_factor"]


def rope_attention_factor(scaling: dict | None) -> float:
    """What longrope multiplies cos and sin by: the config's attention_factor, else
    sqrt(1 + log(factor) / log(original_max)) (1 for other kinds)."""
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind != "longrope":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def rope_cos_sin(
    max_pos: int,
    head_dim: int,
    theta: float,
    *,
    scaling: dict | None = None,
    rotary_dim: int = 0,
    context_len: int | None = None,
) -> np.ndarray:
    """float32 [max_pos, head_dim]: cos(p * inv_freq) in [:, :D/2], sin in [:, D/2:], computed
    in float64 and rounded once. rotary_dim (0: head_dim): the rotated width R; the table's
    columns R/2 .. D/2 then hold cos 1, sin 0, which the kernels' rotation leaves unchanged
    (the loader lays each head's pass-through dims there, models/phi3_checkpoint).
    context_len: rope_inv_freq's."""
    rotary_dim = rotary_dim or head_dim
    if head_dim % 2 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(
            f"rope_cos_sin: head_dim {head_dim} and rotary_dim {rotary_dim} must be even, "
            "rotary_dim <= head_dim"
        )
    inv_freq = rope_inv_freq(rotary_dim, theta, scaling, context_len=context_len)
    freqs = np.arange(max_pos, dtype=np.float64)[:, None] * inv_freq
    factor = rope_attention_factor(scaling)
    cos = np.ones((max_pos, head_dim // 2))
    sin = np.zeros((max_pos, head_dim // 2))
    cos[:, : rotary_dim // 2] = np.cos(freqs) * factor
    sin[:, : rotary_dim // 2] = np.sin(freqs) * factor
    return np.concatenate([cos, sin], axis=1).astype(np.float32)
