"""The op interface a family's forward is written over (models/llama.py), and what it reads.

The model says what a layer computes; a backend's ops say how (executor/cpu_ops: numba njit
kernels on host arrays; executor/cuda_ops: numba.cuda kernels on a stream, over static
buffers, so that the same forward is what a CUDA graph captures). Each op writes into a buffer
the backend owns for that role and returns it; the model never allocates.

The residual stream is a `Hidden`: `residual` holds the sum so far and `pending` a product not
added yet. rms_norm adds the pending product as it normalizes (one pass over the row), and the
products the model hands to `add_linear` become pending, or, where a backend folds the add
into the linear's epilogue, land in `residual` straight away. Either way the model reads the
same: norm, project, attend, add; norm, gated MLP, add.

rms_norm may also return a deferred norm that only the next linear can take (the CUDA backend
folds the norm into the linear's loads on one-token steps). Backends choose such fused paths
per step from the step's size (`embed` starts a step); the results are the bits the unfused
ops give.
"""

from dataclasses import dataclass
from typing import Protocol

from vtllm.models.weights import ModelWeights


@dataclass(slots=True)
class StepInputs:
    """One step's tokens, flattened over sequences (varlen), as the kernels read them: host
    arrays on the CPU, device views on CUDA."""

    token_slots: object  # [T] int32: slot (mirror row) of each token, -1 for padding
    positions: object  # [T] int32
    slot_mapping: object  # [T] int32: KV cache row of each token (block * size + offset)
    query_start_loc: object  # [S + 1] int32
    seq_lens: object  # [S] int32: context length after this step
    block_tables: object  # [S, max_blocks] int32
    logits_rows: object  # [R] int32: rows of T whose logits are wanted
    input_ids: object = None  # [T] int32 when the host has them; else read from the mirror


@dataclass(slots=True)
class KVCache:
    k: object  # [layers, num_blocks, block_size, kv_heads, head_dim]
    v: object

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    @property
    def block_size(self) -> int:
        return self.k.shape[2]


@dataclass(slots=True)
class Hidden:
    """The residual stream between ops (the module docstring)."""

    residual: object  # [T, hidden] float32
    pending: object = None  # [T, hidden] float32, added by the next rms_norm; or None


class Ops(Protocol):
    """What a Llama-family forward asks of a backend. Weights come back from `bind` with the
    fields of ModelWeights / LayerWeights, in the backend's own form; the model passes them
    back to the ops untouched."""

    def bind(self, weights: ModelWeights, cos_sin) -> object:
        """Weights as the backend's kernels take them; cos_sin [max_positions, head_dim]."""

    def bind_kv(self, kv: KVCache) -> None:
        """The KV cache the attention ops read and write, layer by layer."""

    def fused_layers(self, weights: ModelWeights) -> list | None:
        """Per layer, what decoder_layer takes, when the backend runs every layer of these
        weights as one call; else None (the model then runs the ops one by one)."""

    def decoder_layer(self, layer: int, fused, h: Hidden, step: StepInputs) -> None:
        """One whole layer over h, as the op-by-op loop computes it, bit for bit."""

    def embed(self, weight, step: StepInputs) -> Hidden:
        """Starts a step: its input ids' embedding rows as the residual stream (a vocab-parallel
        backend looks up its shard's ids and all-reduces: executor/tp_ops)."""

    def rms_norm(self, h: Hidden, weight) -> object:
        """residual += pending; returns rms_norm(residual) * weight (maybe deferred)."""

    def qkv_proj(self, x, weight, bias) -> object:
        """[T, q_size + 2 kv_size]: q, k and v side by side (bias may be None)."""

    def attention(self, qkv, q_norm, k_norm, layer: int, step: StepInputs) -> object:
        """q/k norm (when given), rotary, the KV write and causal attention: [T, q_size]."""

    def add_linear(self, x, weight, h: Hidden) -> None:
        """x @ W.T into the residual stream (a row-parallel W: the ranks' partial products,
        all-reduced here)."""

    def gated_up(self, x, weight) -> object:
        """silu(gate) * up of x @ W.T for a gate/up matrix: [T, intermediate]."""

    def lm_head(self, h: Hidden, norm, weight, step: StepInputs) -> object:
        """Logits [R, vocab] float32 of the step's logits rows, after the final norm (a
        vocab-parallel backend all-gathers its shards' columns: every rank gets whole rows)."""


class GemmaOps(Ops, Protocol):
    """What the Gemma forward (models/gemma) asks beyond Ops (attention_spec and
    attention_with also serve the Llama forward's sliding windows). executor/cpu_ops and
    executor/cuda_ops implement it."""

    def embed_scaled(self, weight, step: StepInputs, factor: float) -> Hidden:
        """embed, times factor; where the embedding is stored as F16 / BF16, the factor and
        the product are rounded to that type, as HF computes it in the model's dtype."""

    def attention_spec(self, cos_sin, scale: float, window: int, softcap: float) -> object:
        """A layer's attention settings in the backend's form: its rotary table
        [max_positions, head_dim], score scale, sliding window (keys seen, the query's own
        included; 0: all) and score soft-cap (cap * tanh(s / cap); 0: none)."""

    def attention_with(self, qkv, q_norm, k_norm, layer: int, step: StepInputs, spec) -> object:
        """attention under a spec from attention_spec: [T, q_size]."""

    def add_linear_normed(self, x, weight, norm, h: Hidden) -> None:
        """rms_norm(x @ W.T) * norm into the residual stream (Gemma's post-norms)."""

    def geglu_up(self, x, weight) -> object:
        """gelu_tanh(gate) * up of x @ W.T for a gate/up matrix: [T, intermediate]."""

    def soft_cap(self, logits, cap: float) -> object:
        """logits <- cap * tanh(logits / cap), in place; returns them."""


class MoeOps(Ops, Protocol):
    """What the mixture-of-experts forward (models/moe) asks beyond Ops: the router and the
    routed experts. executor/cpu_ops and executor/cuda_moe (CudaOps) implement it."""

    def route(self, x, router, top_k: int, renormalize: bool) -> object:
        """Each token's top_k experts and their weights, from softmax(x @ router.T) in
        float32: experts in rank order (probability descending, ties to the lower index),
        weights divided by their sum when renormalize."""

    def add_experts(self, x, routing, gate_up, down, h: Hidden) -> None:
        """Per token, the sum over its routed experts in rank order of weight *
        down(silu(gate) * up) of its row of x, into the residual stream; gate_up and down
        per expert, as MoeWeights holds them. A token's bits are its own: never a function
        of the other tokens of the step or of an expert."""
