"""The CPU backend's ops (models/ops.Ops): numba njit kernels on host arrays.

`kernels` is a CPU kernel table: vtllm.kernels.cpu (exact float32) or its `fast` table (int8
activations in quantized linears, and `decoder_layer`, a whole layer in one call). A step's
scratch is allocated once, at `embed`, at the step's size, and reused by every layer.
Hot path: keep it lean.
"""

import numpy as np

from vtllm.kernels import QType
from vtllm.models.config import ModelConfig
from vtllm.models.ops import Hidden, KVCache, StepInputs
from vtllm.models.weights import ModelWeights, Weight


class CpuOps:
    def __init__(self, kernels, config: ModelConfig):
        self.k = kernels
        self.config = config
        self.eps = config.rms_norm_eps
        self.scale = float(config.head_dim) ** -0.5
        self.kv: KVCache | None = None
        self.bufs: dict[str, np.ndarray] = {}
        if config.num_experts:  # imported here: the CPU kernels compile on import
            from vtllm.kernels.cpu import moe

            self.moe = moe

    # -- binding --------------------------------------------------------------------------
    def bind(self, weights: ModelWeights, cos_sin) -> ModelWeights:
        self.cos_sin = cos_sin
        return weights

    def bind_kv(self, kv: KVCache) -> None:
        self.kv = kv

    def fused_layers(self, weights: ModelWeights) -> list[tuple] | None:
        """Per layer, the weights as the table's `decoder_layer` takes them, when it has that
        op and every layer fits it (one fused qkv and gate_up matrix, no q/k norm)."""
        k = self.k
        if not hasattr(k, "decoder_layer"):
            return None
        out = []
        for layer in weights.layers:
            if len(layer.qkv) != 1 or len(layer.gate_up) != 1 or layer.q_norm is not None:
                return None
            qkv, gu, o, down = layer.qkv[0], layer.gate_up[0], layer.o, layer.down
            fw = k.layer_weights(
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

    # -- one step -------------------------------------------------------------------------
    def embed(self, weight: Weight, step: StepInputs) -> Hidden:
        c, n = self.config, step.input_ids.shape[0]
        empty = self.k.empty
        b = self.bufs = {
            "x": empty((n, c.hidden_size), np.float32),
            "h": empty((n, c.hidden_size), np.float32),
            "qkv": empty((n, c.q_size + 2 * c.kv_size), np.float32),
            "attn": empty((n, c.num_heads, c.head_dim), np.float32),
            "gate_up": empty((n, 2 * c.intermediate_size), np.float32),
            "act": empty((n, c.intermediate_size), np.float32),
        }
        residual = empty((n, c.hidden_size), np.float32)
        self.k.embedding(step.input_ids, weight.data, weight.qtype, residual)
        b["residual"] = residual
        return Hidden(residual)

    def decoder_layer(self, layer: int, fused, h: Hidden, step: StepInputs) -> None:
        c, b, n = self.config, self.bufs, h.residual.shape[0]
        empty = self.k.empty
        if "q" not in b:
            b["q"] = empty((n, c.num_heads, c.head_dim), np.float32)
            b["k"] = empty((n, c.num_kv_heads, c.head_dim), np.float32)
            b["v"] = empty((n, c.num_kv_heads, c.head_dim), np.float32)
        names = ("residual", "h", "x", "qkv", "q", "k", "v", "attn", "gate_up", "act")
        self.k.decoder_layer(
            h.pending is None,
            tuple(b[name] for name in names),
            fused,
            self.eps,
            self.kv.k[layer],
            self.kv.v[layer],
            step.positions,
            self.cos_sin,
            step.slot_mapping,
            step.block_tables,
            step.seq_lens,
            step.query_start_loc,
            self.scale,
        )
        h.pending = b["h"]

    def rms_norm(self, h: Hidden, weight) -> np.ndarray:
        x = self.bufs["x"]
        if h.pending is None:
            self.k.rms_norm(h.residual, weight, self.eps, x)
        else:  # residual += pending, x = norm(residual)
            self.k.rms_norm(h.pending, weight, self.eps, x, residual=h.residual)
            h.pending = None
        return x

    def _project(self, x: np.ndarray, weights: list[Weight], out: np.ndarray, bias) -> None:
        """x @ W.T for a fused matrix, or for its parts written side by side."""
        k = self.k
        if len(weights) == 1:
            k.linear(x, weights[0].data, weights[0].qtype, out, bias=bias)
            return
        col = 0
        for w in weights:
            part = k.empty((x.shape[0], w.shape[0]), np.float32)
            part_bias = None if bias is None else np.ascontiguousarray(bias[col : col + w.shape[0]])
            k.linear(x, w.data, w.qtype, part, bias=part_bias)
            out[:, col : col + w.shape[0]] = part
            col += w.shape[0]

    def qkv_proj(self, x, weight: list[Weight], bias) -> np.ndarray:
        self._project(x, weight, self.bufs["qkv"], bias)
        return self.bufs["qkv"]

    def attention(self, qkv, q_norm, k_norm, layer: int, step: StepInputs) -> np.ndarray:
        return self._attention(qkv, q_norm, k_norm, layer, step, self.cos_sin, self.scale)

    def _attention(self, qkv, q_norm, k_norm, layer, step, cos_sin, scale, window=0, cap=0.0):
        c, k, kv = self.config, self.k, self.kv
        n, dim, q_size, kv_size = qkv.shape[0], c.head_dim, c.q_size, c.kv_size
        q = np.ascontiguousarray(qkv[:, :q_size]).reshape(n, c.num_heads, dim)
        key = np.ascontiguousarray(qkv[:, q_size : q_size + kv_size])
        key = key.reshape(n, c.num_kv_heads, dim)
        v = np.ascontiguousarray(qkv[:, q_size + kv_size :]).reshape(n, c.num_kv_heads, dim)
        if q_norm is not None:
            q2 = q.reshape(-1, dim)
            k.rms_norm(q2, q_norm, self.eps, q2)
            k2 = key.reshape(-1, dim)
            k.rms_norm(k2, k_norm, self.eps, k2)
        k.rotary(q, key, step.positions, cos_sin)
        k.write_kv(key, v, kv.k[layer], kv.v[layer], step.slot_mapping)
        attn = self.bufs["attn"]
        paged = (kv.k[layer], kv.v[layer], step.block_tables, step.seq_lens, step.query_start_loc)
        if window or cap:
            k.paged_attention_window(q, *paged, scale, window, cap, attn)
        else:
            k.paged_attention(q, *paged, scale, attn)
        return attn.reshape(n, q_size)

    def add_linear(self, x, weight: Weight, h: Hidden) -> None:
        out = self.bufs["h"]
        self.k.linear(x, weight.data, weight.qtype, out)
        h.pending = out

    def gated_up(self, x, weight: list[Weight]) -> np.ndarray:
        self._project(x, weight, self.bufs["gate_up"], None)
        self.k.silu_and_mul(self.bufs["gate_up"], self.bufs["act"])
        return self.bufs["act"]

    def lm_head(self, h: Hidden, norm, weight: Weight, step: StepInputs) -> np.ndarray:
        c, k, rows = self.config, self.k, step.logits_rows
        final = k.empty((rows.shape[0], c.hidden_size), np.float32)
        residual = np.ascontiguousarray(h.residual[rows])
        if h.pending is None:
            k.rms_norm(residual, norm, self.eps, final)
        else:
            k.rms_norm(
                np.ascontiguousarray(h.pending[rows]), norm, self.eps, final, residual=residual
            )
        logits = k.empty((rows.shape[0], c.vocab_size), np.float32)
        k.linear(final, weight.data, weight.qtype, logits)
        return logits

    # -- what the Gemma forward adds (models/ops.GemmaOps) ----------------------------------
    def embed_scaled(self, weight: Weight, step: StepInputs, factor: float) -> Hidden:
        h = self.embed(weight, step)
        scale = _round_to(np.array([factor], np.float32), weight.qtype)
        h.residual *= scale[0]
        _round_to(h.residual, weight.qtype)
        return h

    def attention_spec(self, cos_sin, scale: float, window: int, softcap: float) -> tuple:
        return (np.ascontiguousarray(cos_sin, np.float32), float(scale), int(window), softcap)

    def attention_with(self, qkv, q_norm, k_norm, layer: int, step: StepInputs, spec):
        cos_sin, scale, window, cap = spec
        return self._attention(qkv, q_norm, k_norm, layer, step, cos_sin, scale, window, cap)

    def add_linear_normed(self, x, weight: Weight, norm, h: Hidden) -> None:
        out = self.bufs["h"]
        self.k.linear(x, weight.data, weight.qtype, out)
        self.k.rms_norm(out, norm, self.eps, out)
        h.pending = out

    def geglu_up(self, x, weight: list[Weight]) -> np.ndarray:
        self._project(x, weight, self.bufs["gate_up"], None)
        self.k.gelu_tanh_and_mul(self.bufs["gate_up"], self.bufs["act"])
        return self.bufs["act"]

    def soft_cap(self, logits, cap: float) -> np.ndarray:
        self.k.soft_cap(logits, cap)
        return logits

    # -- what the MoE forward adds (models/ops.MoeOps) --------------------------------------
    def route(self, x, router: Weight, top_k: int, renormalize: bool) -> tuple:
        n = x.shape[0]
        logits = self.k.empty((n, router.shape[0]), np.float32)
        self.k.linear(x, router.data, router.qtype, logits)
        ids = np.empty((n, top_k), np.int32)
        weights = np.empty((n, top_k), np.float32)
        self.moe.route_top_k(logits, renormalize, ids, weights)
        return ids, weights

    def add_experts(self, x, routing, gate_up: list, down: list[Weight], h: Hidden) -> None:
        """Each expert's linears over its routed rows only (gathered in expert order, so each
        expert's rows are one contiguous slice), then each token's sum in rank order."""
        ids, weights = routing
        k, moe, num_experts = self.k, self.moe, len(down)
        rows, hidden, width = ids.size, x.shape[1], down[0].shape[1]
        order = np.empty(rows, np.int32)
        position = np.empty(rows, np.int32)
        offsets = np.empty(num_experts + 1, np.int32)
        moe.group_by_expert(ids, num_experts, order, position, offsets)
        xs = k.empty((rows, hidden), np.float32)
        np.take(x, order // ids.shape[1], axis=0, out=xs)
        gu = k.empty((rows, 2 * width), np.float32)
        act = k.empty((rows, width), np.float32)
        ys = k.empty((rows, hidden), np.float32)
        for e in range(num_experts):
            a, b = offsets[e], offsets[e + 1]
            if a == b:
                continue
            self._project(xs[a:b], gate_up[e], gu[a:b], None)
            k.silu_and_mul(gu[a:b], act[a:b])
            k.linear(act[a:b], down[e].data, down[e].qtype, ys[a:b])
        out = self.bufs["h"]
        moe.combine(ys, position, weights, out)
        h.pending = out


def _round_to(x: np.ndarray, qtype: QType) -> np.ndarray:
    """x (float32) rounded in place to F16 / BF16 values when qtype is one of them."""
    if qtype == QType.F16:
        x[...] = x.astype(np.float16)
    elif qtype == QType.BF16:  # to nearest even, on the bits
        bits = x.view(np.uint32)
        bits += 0x7FFF + ((bits >> 16) & 1)
        bits &= 0xFFFF0000
    return x
