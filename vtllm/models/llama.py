"""The Llama family forward (llama, mistral, qwen2, qwen3, phi3): the only one, for every
backend.

Pre-norm decoder layers over a residual stream; GQA attention over a paged KV cache with
rotary positions (qwen3: q/k norm first; qwen2: a qkv bias; mistral, phi3: a sliding window
on every layer when the config sets one, qwen2 / qwen3: on the layers it names); a SwiGLU MLP;
tied or untied lm_head. The backend's ops (models/ops) say how each step runs: kernels,
buffers, fusions.
Hot path: keep it lean, put features in helpers.
"""

import numpy as np

from vtllm.errors import UnsupportedModel
from vtllm.models.config import ModelConfig
from vtllm.models.ops import KVCache, Ops, StepInputs
from vtllm.models.weights import ModelWeights

__all__ = ["KVCache", "LlamaModel", "StepInputs", "rope_table"]


def rope_table(config: ModelConfig, weights: ModelWeights, max_positions: int, ops=None):
    """cos_sin [max_positions, head_dim] float32 on the host; ops: a kernel table with
    rope_cos_sin (the shared host table by default)."""
    if weights.rope_freq_factors is None:
        if ops is None:
            from vtllm.kernels import rope_table as ops
        return ops.rope_cos_sin(
            max_positions,
            config.head_dim,
            config.rope_theta,
            scaling=config.rope_scaling,
            rotary_dim=config.rotary_dim,
            context_len=max_positions - 1,  # runners size the table max_model_len + 1
        )
    # GGUF llama3 files carry the scaling as per-frequency divisors instead of parameters.
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv_freq /= weights.rope_freq_factors.astype(np.float64)
    freqs = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1).astype(np.float32)


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: ModelWeights, ops: Ops, max_positions: int):
        self.config = config
        self.ops = ops
        cos_sin = rope_table(config, weights, max_positions)
        self.w = ops.bind(weights, cos_sin)
        # The CPU's fast numerics run a whole layer in one call (one numba dispatch instead
        # of a dozen, and its scratch stays in cache); None where the backend has no such
        # kernel for these weights, or to run the ops one by one (same bits).
        self.fused = ops.fused_layers(weights)
        # per layer: the windowed attention's spec, or None for plain attention. A window no
        # shorter than the longest sequence changes nothing: plain attention everywhere.
        self.window_specs = [None] * config.num_layers
        if 0 < config.sliding_window < max_positions - 1:
            if not hasattr(ops, "attention_spec"):
                raise UnsupportedModel(
                    f"{config.architecture}: sliding_window {config.sliding_window} shorter "
                    "than max_model_len needs windowed attention, which this backend lacks"
                )
            scale = float(config.head_dim) ** -0.5
            spec = ops.attention_spec(cos_sin, scale, config.sliding_window, 0.0)
            sliding = config.sliding_layers or (True,) * config.num_layers
            self.window_specs = [spec if s else None for s in sliding]
            self.fused = None  # the fused layer attends without a window

    def forward(self, step: StepInputs):
        """Runs every layer over the step's tokens; returns float32 logits [R, vocab]."""
        ops, w = self.ops, self.w
        h = ops.embed(w.embed, step)
        if self.fused is not None:
            for i, fused in enumerate(self.fused):
                ops.decoder_layer(i, fused, h, step)
            return ops.lm_head(h, w.final_norm, w.lm_head, step)
        for i, layer in enumerate(w.layers):
            x = ops.rms_norm(h, layer.attn_norm)
            qkv = ops.qkv_proj(x, layer.qkv, layer.qkv_bias)
            window = self.window_specs[i]
            if window is None:
                attn = ops.attention(qkv, layer.q_norm, layer.k_norm, i, step)
            else:
                attn = ops.attention_with(qkv, layer.q_norm, layer.k_norm, i, step, window)
            ops.add_linear(attn, layer.o, h)
            x = ops.rms_norm(h, layer.ffn_norm)
            ops.add_linear(ops.gated_up(x, layer.gate_up), layer.down, h)
        return ops.lm_head(h, w.final_norm, w.lm_head, step)
