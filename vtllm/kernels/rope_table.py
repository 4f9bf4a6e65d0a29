"""The rotary embedding's cos/sin table, built on the host in numpy for both backends.

Backend-neutral (numpy only): kernels.cpu.rope rotates by it as is, kernels.cuda.rope by the same
float32 table copied to the device once, so neither backend imports the other.
"""

import math

import numpy as np


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> np.ndarray:
    """float64 [head_dim/2] inverse frequencies, as HF transformers derives them."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64) / head_dim))
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
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


def rope_cos_sin(
    max_pos: int, head_dim: int, theta: float, *, scaling: dict | None = None
) -> np.ndarray:
    """float32 [max_pos, head_dim]: cos(p * inv_freq) in [:, :D/2], sin in [:, D/2:], computed
    in float64 and rounded once."""
    if head_dim % 2:
        raise ValueError(f"rope_cos_sin: head_dim must be even, got {head_dim}")
    freqs = np.arange(max_pos, dtype=np.float64)[:, None] * rope_inv_freq(head_dim, theta, scaling)
    return np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1).astype(np.float32)
