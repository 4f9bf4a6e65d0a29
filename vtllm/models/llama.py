"""The Llama family forward (llama, mistral, qwen2, qwen3) over a table of kernel launchers.

`ops` is a kernel namespace (vtllm.kernels.cpu or its `fast` table; the GPU runs its own
forward over static buffers, executor/cuda_model): embedding, rms_norm, linear, rotary,
write_kv, paged_attention, silu_and_mul, plus `empty` for scratch.
Hot path: keep it lean, put features in helpers.
"""

from dataclasses import dataclass

import numpy as np

from vtllm.models.config import ModelConfig
from vtllm.models.weights import ModelWeights, Weight


@dataclass(slots=True)
class ForwardBatch:
    """One step's tokens, flattened over sequences (varlen), as the kernels read them."""

    input_ids: np.ndarray  # [T] int32
    positions: np.ndarray  # [T] int32
    slot_mapping: np.ndarray  # [T] int32: KV cache row of each token (block * size + offset)
    query_start_loc: np.ndarray  # [S + 1] int32
    seq_lens: np.ndarray  # [S] int32: context length after this step
    block_tables: np.ndarray  # [S, max_blocks] int32
    logits_rows: np.ndarray  # [R] int32: rows of T whose logits are wanted


@dataclass(slots=True)
class KVCache:
    k: np.ndarray  # [layers, num_blocks, block_size, kv_heads, head_dim] float32
    v: np.ndarray

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    @property
    def block_size(self) -> int:
        return self.k.shape[2]


def rope_table(config: ModelConfig, weights: ModelWeights, max_positions: int, ops) -> np.ndarray:
    if weights.rope_freq_factors is None:
        return ops.rope_cos_sin(
            max_positions, config.head_dim, config.rope_theta, scaling=config.rope_scaling
        )
    # GGUF llama3 files carry the scaling as per-frequency divisors instead of parameters.
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv_freq /= weights.rope_freq_factors.astype(np.float64)
    freqs = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq)
    return np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1).astype(np.float32)


def fused_layers(weights: ModelWeights, ops) -> list[tuple] | None:
    """Per layer, the weights as `ops.decoder_layer` takes them, when the table has that op
    and every layer fits it (one fused qkv and gate_up matrix, no q/k norm); else None."""
    if not hasattr(ops, "decoder_layer"):
        return None
    out = []
    for layer in weights.layers:
        if len(layer.qkv) != 1 or len(layer.gate_up) != 1 or layer.q_norm is not None:
            return None
        qkv, gu, o, down = layer.qkv[0], layer.gate_up[0], layer.o, layer.down
        fw = ops.layer_weights(
            layer.attn_norm,
            qkv.data,
            qkv.qtype,
            layer.qkv_bias,
            o.data,
            o.qtype,
            layer.ffn_norm,
            gu.data,
            gu.qtype,
            down.data,
            down.qtype,
        )
        if fw is None:
            return None
        out.append(fw)
    return out


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: ModelWeights, ops, max_positions: int):
        self.config = config
        self.weights = weights
        self.ops = ops
        self.cos_sin = rope_table(config, weights, max_positions, ops)
        self.scale = float(config.head_dim) ** -0.5
        self.fused = fused_layers(weights, ops)

    def _project(self, x: np.ndarray, weights: list[Weight], out: np.ndarray, bias) -> None:
        """x @ W.T for a fused matrix, or for its parts written side by side."""
        ops = self.ops
        if len(weights) == 1:
            ops.linear(x, weights[0].data, weights[0].qtype, out, bias=bias)
            return
        col = 0
        for w in weights:
            part = ops.empty((x.shape[0], w.shape[0]), np.float32)
            part_bias = None if bias is None else np.ascontiguousarray(bias[col : col + w.shape[0]])
            ops.linear(x, w.data, w.qtype, part, bias=part_bias)
            out[:, col : col + w.shape[0]] = part
            col += w.shape[0]

    def forward(self, batch: ForwardBatch, kv: KVCache) -> np.ndarray:
        """Runs every layer over the batch; returns float32 logits [R, vocab]."""
        cfg, w, ops = self.config, self.weights, self.ops
        num_tokens = batch.input_ids.shape[0]
        hidden, eps = cfg.hidden_size, cfg.rms_norm_eps
        q_size, kv_size, dim = cfg.q_size, cfg.kv_size, cfg.head_dim
        empty = ops.empty

        residual = empty((num_tokens, hidden), np.float32)
        ops.embedding(batch.input_ids, w.embed.data, w.embed.qtype, residual)
        x = empty((num_tokens, hidden), np.float32)
        h = empty((num_tokens, hidden), np.float32)
        qkv = empty((num_tokens, q_size + 2 * kv_size), np.float32)
        attn = empty((num_tokens, cfg.num_heads, dim), np.float32)
        gate_up = empty((num_tokens, 2 * cfg.intermediate_size), np.float32)
        act = empty((num_tokens, cfg.intermediate_size), np.float32)

        if self.fused is not None:  # the same layers, one kernel call each
            q = empty((num_tokens, cfg.num_heads, dim), np.float32)
            k = empty((num_tokens, cfg.num_kv_heads, dim), np.float32)
            v = empty((num_tokens, cfg.num_kv_heads, dim), np.float32)
            bufs = (residual, h, x, qkv, q, k, v, attn, gate_up, act)
            for i, fw in enumerate(self.fused):
                ops.decoder_layer(
                    i == 0,
                    bufs,
                    fw,
                    eps,
                    kv.k[i],
                    kv.v[i],
                    batch.positions,
                    self.cos_sin,
                    batch.slot_mapping,
                    batch.block_tables,
                    batch.seq_lens,
                    batch.query_start_loc,
                    self.scale,
                )
        for i, layer in enumerate(w.layers if self.fused is None else ()):
            if i == 0:
                ops.rms_norm(residual, layer.attn_norm, eps, x)
            else:  # residual += h (last MLP output), x = norm(residual)
                ops.rms_norm(h, layer.attn_norm, eps, x, residual=residual)
            self._project(x, layer.qkv, qkv, layer.qkv_bias)
            q = np.ascontiguousarray(qkv[:, :q_size]).reshape(num_tokens, cfg.num_heads, dim)
            k = np.ascontiguousarray(qkv[:, q_size : q_size + kv_size])
            k = k.reshape(num_tokens, cfg.num_kv_heads, dim)
            v = np.ascontiguousarray(qkv[:, q_size + kv_size :])
            v = v.reshape(num_tokens, cfg.num_kv_heads, dim)
            if layer.q_norm is not None:
                q2 = q.reshape(-1, dim)
                ops.rms_norm(q2, layer.q_norm, eps, q2)
                k2 = k.reshape(-1, dim)
                ops.rms_norm(k2, layer.k_norm, eps, k2)
            ops.rotary(q, k, batch.positions, self.cos_sin)
            ops.write_kv(k, v, kv.k[i], kv.v[i], batch.slot_mapping)
            ops.paged_attention(
                q,
                kv.k[i],
                kv.v[i],
                batch.block_tables,
                batch.seq_lens,
                batch.query_start_loc,
                self.scale,
                attn,
            )
            ops.linear(attn.reshape(num_tokens, q_size), layer.o.data, layer.o.qtype, h)
            ops.rms_norm(h, layer.ffn_norm, eps, x, residual=residual)
            self._project(x, layer.gate_up, gate_up, None)
            ops.silu_and_mul(gate_up, act)
            ops.linear(act, layer.down.data, layer.down.qtype, h)

        rows = batch.logits_rows
        final = empty((rows.shape[0], hidden), np.float32)
        ops.rms_norm(
            np.ascontiguousarray(h[rows]),
            w.final_norm,
            eps,
            final,
            residual=np.ascontiguousarray(residual[rows]),
        )
        logits = empty((rows.shape[0], cfg.vocab_size), np.float32)
        ops.linear(final, w.lm_head.data, w.lm_head.qtype, logits)
        return logits
