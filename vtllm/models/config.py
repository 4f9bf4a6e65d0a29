"""Model hyper-parameters, read from GGUF metadata or an HF config.json."""

import msgspec


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    architecture: str  # registry name: llama, mistral, qwen2, qwen3, gemma*, qwen3_moe, mixtral
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = None  # HF-style: {"rope_type": "llama3"|"linear", ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    rotary_dim: int = 0  # dims of a head that rotate (Phi's partial rotary); 0: head_dim
    # Gemma (models/gemma); the Llama forward reads sliding_window alone (Mistral, Phi-3: on
    # every layer).
    sliding_window: int = 0  # keys a windowed layer sees, itself included; 0: no window
    sliding_layers: tuple[bool, ...] = ()  # per layer: whether the window applies
    rope_local_theta: float = 0.0  # rope base of windowed layers when not rope_theta (Gemma 3)
    query_pre_attn_scalar: float = 0.0  # attention scale is its -1/2 power; 0: head_dim's
    attn_logit_softcap: float = 0.0  # scores <- cap * tanh(scores / cap); 0: none
    final_logit_softcap: float = 0.0  # the same on the logits
    # Mixture of experts (models/moe); 0 experts: a dense model.
    num_experts: int = 0
    num_experts_per_tok: int = 0  # top-k: experts each token runs
    moe_intermediate_size: int = 0  # an expert's width (intermediate_size: the dense layers')
    norm_topk_prob: bool = False  # the top-k weights renormalized to sum to 1
    decoder_sparse_step: int = 1  # Qwen3-MoE: layer i routes when (i + 1) % step == 0 ...
    mlp_only_layers: tuple[int, ...] = ()  # ... and is not one of these (a dense MLP)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether the layer routes to experts (else it has a dense MLP), as transformers'
        Qwen3-MoE decides it; every layer of Mixtral."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim
