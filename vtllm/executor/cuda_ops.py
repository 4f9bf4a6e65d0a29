"""The CUDA backend's ops (models/ops.Ops): numba.cuda kernels enqueued on one stream, over
static buffers. Hot path: keep it lean.

Every buffer is allocated once, at bind time, at the largest step (the arena), and a step uses
leading views of them, so a step can be captured into a CUDA graph and replayed: nothing
allocates, every pointer stays put. Weights are uploaded once (kernels/cuda/matmul: q/k/v and
gate/up fused, bf16 matrices packed for the tensor cores). Which kernel runs for which step is
the kernel modules' choice (kernels/cuda/matmul, kernels/cuda/attention).

Per step (`embed`), the ops pick their fused paths from the step's size; each gives the bits of
the unfused ops:
- One-token steps of a model whose linears are all packed fold the layers' norms away
  (FOLD_TOKENS): rms_norm returns a deferred norm that the qkv and gate_up linears apply as
  they load the residual stream, and the o and down linears add their products into it, so a
  layer runs 6 kernels instead of 8 (linear_mma's norm_weight and accumulate). Each block of
  a folded linear sums the row itself, a latency that only pays where it replaces a kernel
  boundary at one token: with more tokens, and for the lm_head's thousands of blocks, each
  block repeating the row's sum costs more than the separate norm kernel.
- Attention takes the fused projection: q/k norm, rotary, the KV write and attention, in one
  kernel for one-token steps, else in two (kernels/cuda/attention.qkv_attention chooses).
- A gate/up linear writes silu(gate) * up from its epilogue where its kernel has one.
Gemma (models/ops.GemmaOps) runs unfolded: its post-norms normalize a branch's product before
it joins the residual stream, which the folded epilogue (residual += product) cannot do; its
GeGLU runs after the linear (gelu_tanh_and_mul), and windowed or soft-capped layers attend in
the kernel attention.paged_attention gives them.
"""

from dataclasses import dataclass

import numpy as np
from numba import cuda

from vtllm.executor.cuda_moe import CudaMoeOps, upload_moe
from vtllm.kernels import cuda as kernels
from vtllm.kernels.cuda.activation import gelu_tanh_and_mul, soft_cap
from vtllm.kernels.cuda.attention import make_scratch, qkv_attention
from vtllm.kernels.cuda.embedding import embedding_scaled
from vtllm.kernels.cuda.gather import gather_rows, gather_tokens
from vtllm.kernels.cuda.matmul import (
    DeviceWeight,
    MixedRows,
    for_tensor_cores,
    upload_matrix,
    upload_mixed,
    x_scratch_words,
)
from vtllm.models.config import ModelConfig
from vtllm.models.ops import Hidden, KVCache, StepInputs
from vtllm.models.weights import ModelWeights, Weight, concat_rows

FOLD_TOKENS = 1  # steps of up to this many tokens fold the layers' norms in (the docstring)


@dataclass(slots=True)
class DeviceLayer:
    attn_norm: object
    qkv: DeviceWeight | MixedRows  # MixedRows where q, k, v have different storage types
    qkv_bias: object | None
    q_norm: object | None
    k_norm: object | None
    o: DeviceWeight
    ffn_norm: object
    gate_up: DeviceWeight | MixedRows | None  # packed: rows interleaved in runs of 8 (matmul)
    down: DeviceWeight | None  # gate_up and down None on a routed layer (moe instead)
    moe: object | None = None  # DeviceMoe (executor/cuda_moe)
    post_attn_norm: object | None = None  # Gemma's norms of a branch's output
    post_ffn_norm: object | None = None


@dataclass(slots=True)
class DeviceModel:
    embed: DeviceWeight
    layers: list[DeviceLayer]
    final_norm: object
    lm_head: DeviceWeight


@dataclass(slots=True)
class AttentionSpec:
    """A layer's attention settings (models/ops.GemmaOps.attention_spec)."""

    cos_sin: object  # device [max_positions, head_dim] float32
    scale: float
    window: int  # keys seen, the query's own included; 0: all
    softcap: float  # 0: none


@dataclass(slots=True)
class DeferredNorm:
    """rms_norm(residual) * weight, to be applied by the next linear as it loads residual."""

    residual: object
    weight: object


class CudaOps(CudaMoeOps):
    def __init__(
        self,
        config: ModelConfig,
        *,
        max_tokens: int,
        max_positions: int,
        max_decode_rows: int,
        mirror,
        stream,
        x_bf16: bool = False,
        flash_prefill: bool = False,
        wgmma: bool = False,
        kquant: bool = False,
    ):
        """mirror: the device token mirror [slots, max_positions] int32 that input ids are
        gathered from; x_bf16, wgmma, kquant: see matmul.upload_matrix; flash_prefill: see
        attention.paged_attention; max_decode_rows: the rows split-key attention spreads
        over blocks (its scratch grows with them)."""
        self.config, self.stream, self.mirror = config, stream, mirror
        self.x_bf16, self.wgmma, self.flash_prefill = x_bf16, wgmma, flash_prefill
        self.kquant = kquant
        self.eps = config.rms_norm_eps
        self.scale = float(config.head_dim) ** -0.5
        self.foldable = False
        self.kv_k = self.kv_v = None
        c, n = config, max_tokens

        def buf(*shape, dtype=np.float32):
            return cuda.device_array(shape, dtype, stream=stream)

        self.input_ids = buf(n, dtype=np.int32)
        self.residual, self.x, self.h = (
            buf(n, c.hidden_size),
            buf(n, c.hidden_size),
            buf(n, c.hidden_size),
        )
        self.qkv = buf(n, c.q_size + 2 * c.kv_size)
        self.q = buf(n, c.num_heads, c.head_dim)
        self.attn = buf(n, c.num_heads, c.head_dim)
        self.gate_up = buf(n, 2 * c.intermediate_size)
        self.act = buf(n, c.intermediate_size)
        self.final_h, self.final_res = buf(n, c.hidden_size), buf(n, c.hidden_size)
        self.final = buf(n, c.hidden_size)
        self.logits = buf(n, c.vocab_size)
        widest = max(c.hidden_size, c.q_size, c.intermediate_size)
        self.x_scratch = buf(x_scratch_words(n, widest), dtype=np.uint32)  # x split for mma
        self.attn_scratch = make_scratch(
            max_decode_rows, c.num_heads, c.head_dim, max_positions, stream=stream
        )
        self.T, self.fold = 0, False
        self.rope_tables: dict[int, tuple] = {}  # id(host table) -> (host, device): one upload
        self.init_moe(config, n, buf)

    # -- binding --------------------------------------------------------------------------
    def bind(self, weights: ModelWeights, cos_sin) -> DeviceModel:
        s = self.stream

        def w(x: Weight, *, gate_up: bool = False) -> DeviceWeight:
            return upload_matrix(
                x.data,
                x.qtype,
                x.shape,
                gate_up=gate_up,
                x_bf16=self.x_bf16,
                wgmma=self.wgmma,
                kquant=self.kquant,
                stream=s,
            )

        def stacked(parts: list[Weight], *, gate_up: bool = False):
            """q/k/v or gate/up as one matrix, or as MixedRows where their types differ."""
            if len({p.qtype for p in parts}) > 1:
                return upload_mixed(
                    [(p.data, p.qtype) for p in parts],
                    gate_up=gate_up,
                    x_bf16=self.x_bf16,
                    kquant=self.kquant,
                    stream=s,
                )
            return w(parts[0] if len(parts) == 1 else concat_rows(parts), gate_up=gate_up)

        def raw(x: Weight) -> DeviceWeight:
            return DeviceWeight(cuda.to_device(np.ascontiguousarray(x.data), stream=s), x.qtype)

        def vec(a):
            return None if a is None else cuda.to_device(np.ascontiguousarray(a, np.float32), s)

        layers = [
            DeviceLayer(
                attn_norm=vec(layer.attn_norm),
                qkv=stacked(layer.qkv),
                qkv_bias=vec(layer.qkv_bias),
                q_norm=vec(layer.q_norm),
                k_norm=vec(layer.k_norm),
                o=w(layer.o),
                ffn_norm=vec(layer.ffn_norm),
                post_attn_norm=vec(layer.post_attn_norm),
                post_ffn_norm=vec(layer.post_ffn_norm),
                gate_up=stacked(layer.gate_up, gate_up=True) if layer.gate_up else None,
                down=None if layer.down is None else w(layer.down),
                moe=None
                if layer.moe is None
                else upload_moe(layer.moe, w, stream=s, x_bf16=self.x_bf16),
            )
            for layer in weights.layers
        ]
        embed = raw(weights.embed)  # read by row lookups, so never packed
        head = weights.lm_head
        if head is weights.embed and not for_tensor_cores(
            head.qtype, head.shape, kquant=self.kquant
        ):
            lm_head = embed  # tied, and not packed: the rows serve both
        else:  # its own matrix, or (tied, bf16) a packed copy beside the embedding rows
            lm_head = w(head)
        self.cos_sin = self._rope_table(cos_sin)
        self.spec = AttentionSpec(self.cos_sin, self.scale, 0, 0.0)
        mats = [m for layer in layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        self.foldable = all(m.packed for m in mats if m is not None)
        return DeviceModel(embed, layers, vec(weights.final_norm), lm_head)

    def bind_kv(self, kv: KVCache) -> None:
        """Sized after the weights and buffers so that it gets what is left; per-layer views
        made once."""
        self.kv_k = [kv.k[i] for i in range(self.config.num_layers)]
        self.kv_v = [kv.v[i] for i in range(self.config.num_layers)]

    def fused_layers(self, weights: ModelWeights) -> None:
        return None  # fusions act per op here, and graphs make a launch's cost moot

    def decoder_layer(self, layer: int, fused, h: Hidden, step: StepInputs) -> None:
        raise NotImplementedError("the CUDA backend runs layers op by op")

    def _rope_table(self, cos_sin):
        """cos_sin on the device; the same host table (Gemma's layers share two) once."""
        key = id(cos_sin)
        if key not in self.rope_tables:  # the host array is kept so that its id stays its own
            table = cuda.to_device(np.ascontiguousarray(cos_sin, np.float32), stream=self.stream)
            self.rope_tables[key] = (cos_sin, table)
        return self.rope_tables[key][1]

    # -- one step -------------------------------------------------------------------------
    def _start(self, step: StepInputs):
        """A step's size, fusions and input ids; returns (ids, residual) views."""
        T = self.T = step.token_slots.shape[0]
        self.fold = self.foldable and T <= FOLD_TOKENS
        ids, residual = self.input_ids[:T], self.residual[:T]
        gather_tokens(self.mirror, step.token_slots, step.positions, ids, stream=self.stream)
        return ids, residual

    def embed(self, weight: DeviceWeight, step: StepInputs) -> Hidden:
        ids, residual = self._start(step)
        kernels.embedding(ids, weight.data, weight.qtype, residual, stream=self.stream)
        return Hidden(residual)

    def rms_norm(self, h: Hidden, weight):
        if self.fold:  # the norm in the next linear's loads (the module docstring)
            return DeferredNorm(h.residual, weight)
        x = self.x[: self.T]
        if h.pending is None:
            kernels.rms_norm(h.residual, weight, self.eps, x, stream=self.stream)
        else:  # residual += pending, x = norm(residual)
            kernels.rms_norm(
                h.pending, weight, self.eps, x, residual=h.residual, stream=self.stream
            )
            h.pending = None
        return x

    def qkv_proj(self, x, weight: DeviceWeight, bias):
        out, s = self.qkv[: self.T], self.stream
        if isinstance(x, DeferredNorm):
            weight.matmul_folded(
                x.residual, out, bias=bias, norm_weight=x.weight, eps=self.eps, stream=s
            )
        else:
            weight.matmul(x, out, bias=bias, x_scratch=self.x_scratch, stream=s)
        return out

    def attention(self, qkv, q_norm, k_norm, layer: int, step: StepInputs):
        return self.attention_with(qkv, q_norm, k_norm, layer, step, self.spec)

    def add_linear(self, x, weight: DeviceWeight, h: Hidden) -> None:
        if self.fold:  # residual += x @ W.T in the linear's epilogue
            weight.matmul_folded(x, h.residual, accumulate=True, stream=self.stream)
            return
        out = self.h[: self.T]
        weight.matmul(x, out, x_scratch=self.x_scratch, stream=self.stream)
        h.pending = out

    def gated_up(self, x, weight: DeviceWeight):
        act, s = self.act[: self.T], self.stream
        if isinstance(x, DeferredNorm):
            weight.matmul_folded(
                x.residual, None, norm_weight=x.weight, eps=self.eps, act=act, stream=s
            )
        else:
            gate_up = self.gate_up[: self.T]
            weight.matmul(x, gate_up, x_scratch=self.x_scratch, act=act, stream=s)
        return act

    def lm_head(self, h: Hidden, norm, weight: DeviceWeight, step: StepInputs):
        s, rows = self.stream, step.logits_rows
        R = rows.shape[0]
        final_res, final, logits = self.final_res[:R], self.final[:R], self.logits[:R]
        gather_rows(h.residual, rows, final_res, stream=s)
        if h.pending is None:  # residual holds the last MLP output already
            kernels.rms_norm(final_res, norm, self.eps, final, stream=s)
        else:
            final_h = self.final_h[:R]
            gather_rows(h.pending, rows, final_h, stream=s)
            kernels.rms_norm(final_h, norm, self.eps, final, residual=final_res, stream=s)
        weight.matmul(final, logits, x_scratch=self.x_scratch, stream=s)
        return logits

    # -- what the Gemma forward adds (models/ops.GemmaOps) ----------------------------------
    def embed_scaled(self, weight: DeviceWeight, step: StepInputs, factor: float) -> Hidden:
        ids, residual = self._start(step)
        self.fold = False  # the post-norms (the module docstring)
        embedding_scaled(ids, weight.data, weight.qtype, factor, residual, stream=self.stream)
        return Hidden(residual)

    def attention_spec(self, cos_sin, scale: float, window: int, softcap: float):
        return AttentionSpec(self._rope_table(cos_sin), float(scale), int(window), softcap or 0.0)

    def attention_with(self, qkv, q_norm, k_norm, layer: int, step: StepInputs, spec):
        T = self.T
        attn = self.attn[:T]
        qkv_attention(
            qkv,
            self.q[:T],
            self.kv_k[layer],
            self.kv_v[layer],
            step.slot_mapping,
            step.positions,
            spec.cos_sin,
            self.eps,
            step.block_tables,
            step.seq_lens,
            step.query_start_loc,
            spec.scale,
            attn,
            self.attn_scratch,
            q_norm=q_norm,
            k_norm=k_norm,
            flash=self.flash_prefill,
            window=spec.window,
            softcap=spec.softcap,
            stream=self.stream,
        )
        return attn.reshape(T, self.config.q_size)

    def add_linear_normed(self, x, weight: DeviceWeight, norm, h: Hidden) -> None:
        out, s = self.h[: self.T], self.stream
        weight.matmul(x, out, x_scratch=self.x_scratch, stream=s)
        kernels.rms_norm(out, norm, self.eps, out, stream=s)
        h.pending = out

    def geglu_up(self, x, weight: DeviceWeight):
        gate_up, act, s = self.gate_up[: self.T], self.act[: self.T], self.stream
        weight.matmul(x, gate_up, x_scratch=self.x_scratch, stream=s)
        # packed gate/up rows are interleaved in runs of 8 (kernels/cuda/matmul)
        gelu_tanh_and_mul(gate_up, act, tile=8 if weight.packed else 0, stream=s)
        return act

    def soft_cap(self, logits, cap: float):
        soft_cap(logits, cap, stream=self.stream)
        return logits
