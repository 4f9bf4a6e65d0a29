"""The Gemma family forward (Gemma 2, Gemma 3 text): the only one, for every backend.

Gemma's twists on the Llama layer, each an op of models/ops.GemmaOps:
- the embedding is scaled by sqrt(hidden) (in the model's dtype, as HF does);
- RMSNorm multiplies by (1 + w): the loader stores 1 + w, so the plain norm op runs;
- four norms a layer: before and after attention, before and after the MLP (the "after"
  ones normalize a branch's output before it joins the residual stream);
- a GeGLU MLP: gelu (tanh approximation) of gate, times up;
- attention scores scaled by query_pre_attn_scalar ** -1/2 instead of head_dim's, soft-capped
  (Gemma 2) as cap * tanh(s / cap), and windowed on the sliding layers (Gemma 2: every other
  one; Gemma 3: five of six, which rotate with their own rope base and no scaling);
- Gemma 3: q/k norm; Gemma 2: the final logits soft-capped too.
"""

from vtllm.kernels.rope_table import rope_cos_sin
from vtllm.models.config import ModelConfig
from vtllm.models.ops import GemmaOps, StepInputs
from vtllm.models.weights import ModelWeights

__all__ = ["GemmaModel"]


def layer_windows(config: ModelConfig) -> list[int]:
    """Per layer, the keys its attention sees (0: all of them)."""
    sliding = config.sliding_layers or (False,) * config.num_layers
    return [config.sliding_window if s else 0 for s in sliding]


class GemmaModel:
    def __init__(self, config: ModelConfig, weights: ModelWeights, ops: GemmaOps, max_positions):
        c = config
        self.config, self.ops = c, ops
        rope = rope_cos_sin(max_positions, c.head_dim, c.rope_theta, scaling=c.rope_scaling)
        local = rope
        if c.rope_local_theta:
            local = rope_cos_sin(max_positions, c.head_dim, c.rope_local_theta)
        self.w = ops.bind(weights, rope)
        scale = float(c.query_pre_attn_scalar or c.head_dim) ** -0.5
        self.specs = [
            ops.attention_spec(local if window else rope, scale, window, c.attn_logit_softcap)
            for window in layer_windows(c)
        ]
        self.embed_scale = float(c.hidden_size) ** 0.5

    def forward(self, step: StepInputs):
        """Runs every layer over the step's tokens; returns float32 logits [R, vocab]."""
        ops, w = self.ops, self.w
        h = ops.embed_scaled(w.embed, step, self.embed_scale)
        for i, layer in enumerate(w.layers):
            x = ops.rms_norm(h, layer.attn_norm)
            qkv = ops.qkv_proj(x, layer.qkv, layer.qkv_bias)
            attn = ops.attention_with(qkv, layer.q_norm, layer.k_norm, i, step, self.specs[i])
            ops.add_linear_normed(attn, layer.o, layer.post_attn_norm, h)
            x = ops.rms_norm(h, layer.ffn_norm)
            ops.add_linear_normed(
                ops.geglu_up(x, layer.gate_up), layer.down, layer.post_ffn_norm, h
            )
        logits = ops.lm_head(h, w.final_norm, w.lm_head, step)
        if self.config.final_logit_softcap:
            logits = ops.soft_cap(logits, self.config.final_logit_softcap)
        return logits
