"""The Llama-family forward on the GPU over static device buffers. Hot path: keep it lean.

Same math as models.llama.LlamaModel (which runs on host arrays and may allocate per step);
here every buffer is allocated once, at the largest step, and a step uses leading views of
them, so a decode step can be captured into a CUDA graph and replayed: nothing allocates,
every pointer stays put. Weights are uploaded once; q/k/v and gate/up are fused on upload.
A gate/up matrix bound for the tensor cores has its rows interleaved in runs of 8
(activation.tile_interleave), so that each 16-row tile holds 8 gate rows and their 8 up rows:
decode steps then get silu(gate) * up straight from the linear's epilogue (linear_mma and
linear_rows swiglu), and prefill steps (gemm_mma) from silu_and_mul over that layout, with the
same bits.

One-token steps of a model whose layers' linears are all packed fold the layers' norms away
too (FOLD_TOKENS): the qkv and gate_up linears normalize the residual stream as they load it,
and the o and down linears add their products into it, so a layer runs 6 kernels instead of
8, with the bits of the unfolded step (linear_mma's norm_weight and accumulate). Each block of
a folded linear sums the row itself, a latency that only pays where it replaces a kernel
boundary at one token: with more tokens, and for the lm_head's thousands of blocks, each
block repeating the row's sum costs more than the separate norm kernel.
"""

from dataclasses import dataclass

import numpy as np
from numba import cuda

from vtllm.kernels import QType
from vtllm.kernels import cuda as ops
from vtllm.kernels.cuda.activation import tile_interleave
from vtllm.kernels.cuda.attention_split import fuses_rope, make_scratch, rope_attention
from vtllm.kernels.cuda.gather import gather_rows, gather_tokens
from vtllm.kernels.cuda.gemm_mma import gemm_mma, gemm_pays
from vtllm.kernels.cuda.gemm_wgmma import gemm_wgmma, round_x
from vtllm.kernels.cuda.linear_mma import (
    PREPACK_ABOVE,
    linear_mma,
    pack_bf16,
    packable,
    split_x,
    x_scratch_words,
)
from vtllm.kernels.cuda.linear_rows import linear_rows, rows_pay
from vtllm.kernels.cuda.qkv_rope import qkv_rope
from vtllm.models.config import ModelConfig
from vtllm.models.llama import rope_table
from vtllm.models.weights import ModelWeights, Weight, concat_rows

FOLD_TOKENS = 1  # steps of up to this many tokens fold the layers' norms in (the docstring)
# Steps of this many tokens have one token per sequence whatever they are (a captured graph
# serves decode, prefill and mixed steps of its size alike), so attention can make its own
# q and new key (attention_split.rope_attention): one kernel a layer fewer.
ROPE_TOKENS = 1


@dataclass(slots=True)
class DeviceWeight:
    data: object  # device array, layout per QType, or a PackedBF16 for the tensor cores
    qtype: int
    packed: bool = False  # bf16 in mma fragment order (kernels/cuda/linear_mma)
    wgmma: bool = False  # packed with x_bf16, on Hopper: long steps take gemm_wgmma

    def matmul(self, x, out, *, bias=None, x_scratch=None, act=None, stream=0) -> None:
        """out = x @ W.T (+ bias); x_scratch: see linear_mma. Packed W: steps that gemm_pays
        for go to gemm_mma (gemm_wgmma where self.wgmma), batched-decode steps that rows_pay
        for to linear_rows, the rest to linear_mma; all of them give the same bits, so a
        token's row never depends on the size of its step. act: W is a gate/up matrix and act
        [M, N / 2] gets silu(gate) * up, from the linear's epilogue where its kernel has one
        (out then unused), else by silu_and_mul over out (same bits)."""
        m, n = x.shape[0], out.shape[1]
        swiglu = act is not None
        split_step = self.packed and x_scratch is not None and m > PREPACK_ABOVE
        if split_step and gemm_pays(m, n) and self.wgmma:
            gemm_wgmma(
                round_x(x, x_scratch, stream=stream), self.data, out, bias=bias, stream=stream
            )
        elif split_step and gemm_pays(m, n):
            xp = split_x(x, x_scratch, x_bf16=self.data.x_bf16, stream=stream)
            gemm_mma(xp, self.data, out, bias=bias, stream=stream)
        elif split_step and rows_pay(m, n):
            xp = split_x(x, x_scratch, x_bf16=self.data.x_bf16, stream=stream)
            linear_rows(
                xp, self.data, act if swiglu else out, bias=bias, swiglu=swiglu, stream=stream
            )
            return
        elif self.packed:
            linear_mma(
                x,
                self.data,
                act if swiglu else out,
                bias=bias,
                x_scratch=x_scratch,
                swiglu=swiglu,
                stream=stream,
            )
            return
        else:
            ops.linear(x, self.data, self.qtype, out, bias=bias, stream=stream)
        if swiglu:  # packed gate/up rows are interleaved in runs of 8 (the module docstring)
            ops.silu_and_mul(out, act, tile=8 if self.packed else 0, stream=stream)


@dataclass(slots=True)
class DeviceLayer:
    attn_norm: object
    qkv: DeviceWeight
    qkv_bias: object | None
    q_norm: object | None
    k_norm: object | None
    o: DeviceWeight
    ffn_norm: object
    gate_up: DeviceWeight  # packed: rows interleaved in runs of 8 (the module docstring)
    down: DeviceWeight


def _fused(parts: list[Weight], what: str) -> Weight:
    if len(parts) == 1:
        return parts[0]
    if len({w.qtype for w in parts}) != 1:
        raise ValueError(f"the CUDA backend needs one storage type for {what}, got mixed types")
    return concat_rows(parts)


def _for_tensor_cores(x: Weight) -> bool:
    return x.qtype == QType.BF16 and packable(*x.data.shape)


def upload_weights(weights: ModelWeights, stream, *, x_bf16: bool = False, wgmma: bool = False):
    """-> (layers, {embed, lm_head, final_norm}); x_bf16: packed matrices multiply x rounded to
    bf16 (linear_mma.PackedBF16); wgmma (with x_bf16): their long steps take gemm_wgmma."""

    def raw(x: Weight) -> DeviceWeight:
        return DeviceWeight(cuda.to_device(np.ascontiguousarray(x.data), stream=stream), x.qtype)

    def w(x: Weight, *, gate_up: bool = False) -> DeviceWeight:
        """bf16 matrices with 16-aligned shapes go to the tensor cores, packed on the device
        (the raw upload is freed), a fused gate/up one with its rows interleaved in runs of 8
        first (the module docstring); every other type keeps the GEMV kernel of its QType."""
        if not _for_tensor_cores(x):
            return raw(x)
        if gate_up:
            x = Weight(tile_interleave(x.data, 8), x.qtype, x.shape)
        up = raw(x)
        packed = pack_bf16(up.data, x_bf16=x_bf16, stream=stream)
        stream.synchronize()  # the raw copy is freed on return
        return DeviceWeight(packed, x.qtype, packed=True, wgmma=wgmma and x_bf16)

    def vec(a):
        return None if a is None else cuda.to_device(np.ascontiguousarray(a, np.float32), stream)

    layers = [
        DeviceLayer(
            attn_norm=vec(layer.attn_norm),
            qkv=w(_fused(layer.qkv, "q/k/v")),
            qkv_bias=vec(layer.qkv_bias),
            q_norm=vec(layer.q_norm),
            k_norm=vec(layer.k_norm),
            o=w(layer.o),
            ffn_norm=vec(layer.ffn_norm),
            gate_up=w(_fused(layer.gate_up, "gate/up"), gate_up=True),
            down=w(layer.down),
        )
        for layer in weights.layers
    ]
    embed = raw(weights.embed)  # read by row lookups, so never packed
    tied = weights.lm_head is weights.embed
    if tied and not _for_tensor_cores(weights.embed):
        lm_head = embed
    else:  # its own matrix, or (tied, bf16) a packed copy beside the embedding rows
        lm_head = w(weights.lm_head)
    return layers, {"embed": embed, "lm_head": lm_head, "final_norm": vec(weights.final_norm)}


@dataclass(slots=True)
class StepInputs:
    """Device views of one step's metadata (see executor.step_layout.FlatChunks)."""

    token_slots: object  # [T] int32
    positions: object  # [T] int32
    slot_mapping: object  # [T] int32
    query_start_loc: object  # [S + 1] int32
    seq_lens: object  # [S] int32
    block_tables: object  # [S, max_blocks] int32
    logits_rows: object  # [R] int32


class CudaForward:
    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        *,
        max_tokens: int,
        max_positions: int,
        max_decode_rows: int,
        stream,
        x_bf16: bool = False,
        flash_prefill: bool = False,
        wgmma: bool = False,
    ):
        """x_bf16, wgmma: see upload_weights; flash_prefill: see attention.paged_attention."""
        self.config, self.stream = config, stream
        self.flash_prefill = flash_prefill
        self.layers, top = upload_weights(weights, stream, x_bf16=x_bf16, wgmma=wgmma)
        self.embed, self.lm_head, self.final_norm = top["embed"], top["lm_head"], top["final_norm"]
        cos_sin = rope_table(config, weights, max_positions, ops)
        self.cos_sin = cuda.to_device(np.ascontiguousarray(cos_sin, np.float32), stream=stream)
        self.scale = float(config.head_dim) ** -0.5
        mats = [m for layer in self.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        self.foldable = all(m.packed for m in mats)
        self.rope_fusable = fuses_rope(config.num_heads, config.num_kv_heads, config.head_dim)
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
        # split-key attention spreads rows of steps up to max_decode_rows tokens over blocks
        self.attn_scratch = make_scratch(
            max_decode_rows, c.num_heads, c.head_dim, max_positions, stream=stream
        )

    def _weights(self) -> list[DeviceWeight]:
        mats = [self.lm_head]
        for layer in self.layers:
            mats += [layer.qkv, layer.o, layer.gate_up, layer.down]
        return mats

    def bind_kv(self, kv_k, kv_v) -> None:
        """The KV cache ([layers, blocks, block_size, kv_heads, head_dim]), sized after the
        weights and buffers so that it gets what is left; per-layer views made once."""
        self.kv_k = [kv_k[i] for i in range(self.config.num_layers)]
        self.kv_v = [kv_v[i] for i in range(self.config.num_layers)]

    def forward(self, inputs: StepInputs, token_ids_dev):
        """Enqueues the whole forward on the stream; returns the logits view [R, vocab]."""
        c, s = self.config, self.stream
        T, R = inputs.token_slots.shape[0], inputs.logits_rows.shape[0]
        eps = c.rms_norm_eps
        ids, residual, x, h = self.input_ids[:T], self.residual[:T], self.x[:T], self.h[:T]
        qkv, attn, gate_up, act = self.qkv[:T], self.attn[:T], self.gate_up[:T], self.act[:T]
        q, xs = self.q[:T], self.x_scratch
        gather_tokens(token_ids_dev, inputs.token_slots, inputs.positions, ids, stream=s)
        ops.embedding(ids, self.embed.data, self.embed.qtype, residual, stream=s)
        fold = self.foldable and T <= FOLD_TOKENS
        rope_in_attention = self.rope_fusable and T <= ROPE_TOKENS
        for i, layer in enumerate(self.layers):
            if fold:  # the norm in qkv's loads (the module docstring)
                linear_mma(
                    residual,
                    layer.qkv.data,
                    qkv,
                    bias=layer.qkv_bias,
                    norm_weight=layer.attn_norm,
                    eps=eps,
                    stream=s,
                )
            elif i == 0:
                ops.rms_norm(residual, layer.attn_norm, eps, x, stream=s)
            else:  # residual += h (last MLP output), x = norm(residual)
                ops.rms_norm(h, layer.attn_norm, eps, x, residual=residual, stream=s)
            if not fold:
                layer.qkv.matmul(x, qkv, bias=layer.qkv_bias, x_scratch=xs, stream=s)
            norms = {"q_norm": layer.q_norm, "k_norm": layer.k_norm}
            kv = (self.kv_k[i], self.kv_v[i])
            meta = (inputs.block_tables, inputs.seq_lens, inputs.query_start_loc)
            if rope_in_attention:  # q/k norm, rotation and the KV write in attention's blocks
                rope_attention(
                    qkv,
                    *kv,
                    inputs.slot_mapping,
                    inputs.positions,
                    self.cos_sin,
                    eps,
                    *meta,
                    self.scale,
                    attn,
                    self.attn_scratch,
                    **norms,
                    stream=s,
                )
            else:
                qkv_rope(
                    qkv,
                    q,
                    *kv,
                    inputs.slot_mapping,
                    inputs.positions,
                    self.cos_sin,
                    eps,
                    **norms,
                    stream=s,
                )
                ops.paged_attention(
                    q,
                    *kv,
                    *meta,
                    self.scale,
                    attn,
                    scratch=self.attn_scratch,
                    flash=self.flash_prefill,
                    stream=s,
                )
            if fold:  # residual += o(attn), act = SwiGLU(gate_up(norm(residual))), += down(act)
                linear_mma(
                    attn.reshape(T, c.q_size), layer.o.data, residual, accumulate=True, stream=s
                )
                linear_mma(
                    residual,
                    layer.gate_up.data,
                    act,
                    swiglu=True,
                    norm_weight=layer.ffn_norm,
                    eps=eps,
                    stream=s,
                )
                linear_mma(act, layer.down.data, residual, accumulate=True, stream=s)
                continue
            layer.o.matmul(attn.reshape(T, c.q_size), h, x_scratch=xs, stream=s)
            ops.rms_norm(h, layer.ffn_norm, eps, x, residual=residual, stream=s)
            layer.gate_up.matmul(x, gate_up, x_scratch=xs, act=act, stream=s)
            layer.down.matmul(act, h, x_scratch=xs, stream=s)
        final_h, final_res, final = self.final_h[:R], self.final_res[:R], self.final[:R]
        logits = self.logits[:R]
        gather_rows(residual, inputs.logits_rows, final_res, stream=s)
        if fold:  # residual holds the last MLP output already
            ops.rms_norm(final_res, self.final_norm, eps, final, stream=s)
        else:
            gather_rows(h, inputs.logits_rows, final_h, stream=s)
            ops.rms_norm(final_h, self.final_norm, eps, final, residual=final_res, stream=s)
        self.lm_head.matmul(final, logits, x_scratch=xs, stream=s)
        return logits
