"""The mixture-of-experts forward (Qwen3-MoE, Mixtral): the only one, for every backend.

The Llama layer (pre-norm, GQA attention over a paged KV cache with rotary positions;
Qwen3-MoE: q/k norm first) with the SwiGLU MLP replaced, on the layers the config says, by
routed experts (models/ops.MoeOps):
- the router: logits = x @ W_router.T in float32, softmax over the experts, the top k by
  probability (ties to the lower index); Qwen3-MoE divides the k weights by their sum when
  norm_topk_prob, Mixtral always does (its weights are the softmax over the top-k logits);
- each token's output: the sum over its k experts, in rank order, of weight *
  down(silu(gate) * up); the backend runs each expert over its routed rows only.
Qwen3-MoE keeps a dense MLP (width intermediate_size) on the layers in mlp_only_layers or off
the decoder_sparse_step; its experts have their own width, moe_intermediate_size.
Hot path: keep it lean.
"""

from vtllm.models.config import ModelConfig
from vtllm.models.llama import rope_table
from vtllm.models.ops import MoeOps, StepInputs
from vtllm.models.weights import ModelWeights

__all__ = ["MoeModel"]


class MoeModel:
    def __init__(self, config: ModelConfig, weights: ModelWeights, ops: MoeOps, max_positions):
        self.config, self.ops = config, ops
        self.w = ops.bind(weights, rope_table(config, weights, max_positions))
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob

    def forward(self, step: StepInputs):
        """Runs every layer over the step's tokens; returns float32 logits [R, vocab]."""
        ops, w = self.ops, self.w
        h = ops.embed(w.embed, step)
        for i, layer in enumerate(w.layers):
            x = ops.rms_norm(h, layer.attn_norm)
            qkv = ops.qkv_proj(x, layer.qkv, layer.qkv_bias)
            attn = ops.attention(qkv, layer.q_norm, layer.k_norm, i, step)
            ops.add_linear(attn, layer.o, h)
            x = ops.rms_norm(h, layer.ffn_norm)
            moe = layer.moe
            if moe is None:
                ops.add_linear(ops.gated_up(x, layer.gate_up), layer.down, h)
            else:
                routing = ops.route(x, moe.router, self.top_k, self.renormalize)
                ops.add_experts(x, routing, moe.gate_up, moe.down, h)
        return ops.lm_head(h, w.final_norm, w.lm_head, step)
