"""GGUF copies of HF-format checkpoints, so llama.cpp can run the same weights as the peer of
the GPU benchmarks (bench/gpu.py).

llama.cpp reads GGUF only, and its own converter (convert_hf_to_gguf.py) needs torch and
names a tokenizer's pre-tokenizer by a hash of its output, which a synthetic checkpoint's
tokenizer does not match. This writes what that converter writes for the families vtllm loads
(llama, qwen2, qwen3, and the MoE families: qwen3moe, and Mixtral as llama with experts, each
layer's experts stacked into one 3-D ffn_{gate,up,down}_exps tensor and its router as an F32
ffn_gate_inp): F16 matrices; F32 norms and biases; the llama family's Q and K rows
permuted for llama.cpp's rotation; llama3 rope scaling as per-frequency divisors
(`rope_freqs.weight`); Gemma 2, Gemma 3 and Phi-3 by their own conventions
(models/gguf_families: norms as 1 + w, fused Phi-3 tensors, longrope factor tensors); F32
matrices instead of F16 on request; a byte-level BPE tokenizer as a gpt2 vocabulary with the
default pre-tokenizer (the benchmarks send token ids), or for those three families, when the
checkpoint has a tokenizer.model, the converter's SentencePiece vocabulary
(models/gguf_spm_vocab). Tensors are converted and written one at a
time, so the 8B shape (16 GB) never sits in memory whole. llama.cpp as
loadtest/peers/build_llama_cuda.sh builds it loads the synthetic shapes' copies.
"""

import json
import math
from pathlib import Path

import numpy as np

from vtllm.errors import UnsupportedModel
from vtllm.models import gguf_families, gguf_spm_vocab
from vtllm.models.moe_checkpoint import hub_block, hub_names
from vtllm.models.safetensors_loader import map_tensors, read_config

_TOKEN_NORMAL, _TOKEN_CONTROL, _TOKEN_UNUSED = 1, 3, 5  # llama.cpp's token types
_ALL_F32, _MOSTLY_F16 = 0, 1  # general.file_type
# rope scaling each family's GGUF can hold (others are refused)
_SCALINGS = {"gemma2": (None,), "gemma3": (None, "linear"), "phi3": (None, "longrope")}
COPY_NAME = "model-f16.gguf"  # a checkpoint's GGUF copy, beside its weights
# llama.cpp refuses a gpt2 vocabulary without merges, and GGUF has no empty arrays, so a byte
# tokenizer with none (the synthetic ones) gets this one: "!!" is no token, and a merged pair
# that is no token is split back into its bytes, so no text tokenizes differently.
_NO_OP_MERGE = ["! !"]


def permute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half rows -> llama.cpp's interleaved pairs, per head (its converter's
    permute; vtllm's GGUF loader undoes it)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(config) -> np.ndarray:
    """The divisor of each rotary frequency under llama3 rope scaling, as llama.cpp's
    converter computes them (1 for short wavelengths, `factor` for long ones, blended between)."""
    s = config.rope_scaling
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    dim = config.head_dim
    divisors = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * config.rope_theta ** (i / dim)
        if wavelen < old_len / high:
            divisors.append(1.0)
        elif wavelen > old_len / low:
            divisors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, np.float32)


def _tensors(config, fam):
    """(GGUF name, HF name, kind, heads to permute by) in file order; kind is "matrix" (F16),
    "vector" (F32), "router" (an F32 matrix) or "experts" (F16 matrices stacked, one HF name
    each, in a tuple)."""
    out = [("token_embd.weight", "model.embed_tokens.weight", "matrix", None)]
    qk_heads = (config.num_heads, config.num_kv_heads) if fam.gguf_qk_permuted else (None, None)
    for i in range(config.num_layers):
        g, h = f"blk.{i}.", f"model.layers.{i}."
        out += [
            (g + "attn_norm.weight", h + "input_layernorm.weight", "vector", None),
            (g + "attn_q.weight", h + "self_attn.q_proj.weight", "matrix", qk_heads[0]),
            (g + "attn_k.weight", h + "self_attn.k_proj.weight", "matrix", qk_heads[1]),
            (g + "attn_v.weight", h + "self_attn.v_proj.weight", "matrix", None),
        ]
        if config.qkv_bias:
            out += [
                (g + "attn_q.bias", h + "self_attn.q_proj.bias", "vector", qk_heads[0]),
                (g + "attn_k.bias", h + "self_attn.k_proj.bias", "vector", qk_heads[1]),
                (g + "attn_v.bias", h + "self_attn.v_proj.bias", "vector", None),
            ]
        if config.qk_norm:
            out += [
                (g + "attn_q_norm.weight", h + "self_attn.q_norm.weight", "vector", None),
                (g + "attn_k_norm.weight", h + "self_attn.k_norm.weight", "vector", None),
            ]
        out += [
            (g + "attn_output.weight", h + "self_attn.o_proj.weight", "matrix", None),
            (g + "ffn_norm.weight", h + "post_attention_layernorm.weight", "vector", None),
        ]
        if config.is_moe_layer(i):
            router, experts = hub_names(config, hub_block(config, i))
            out.append((g + "ffn_gate_inp.weight", router, "router", None))
            for n, part in enumerate(("gate", "up", "down")):
                stacked = tuple(names[n] for names in experts)
                out.append((g + f"ffn_{part}_exps.weight", stacked, "experts", None))
            continue
        out += [
            (g + "ffn_gate.weight", h + "mlp.gate_proj.weight", "matrix", None),
            (g + "ffn_up.weight", h + "mlp.up_proj.weight", "matrix", None),
            (g + "ffn_down.weight", h + "mlp.down_proj.weight", "matrix", None),
        ]
    out.append(("output_norm.weight", "model.norm.weight", "vector", None))
    if not config.tie_word_embeddings:
        out.append(("output.weight", "lm_head.weight", "matrix", None))
    return out


def _names(hf) -> tuple[str, ...]:
    return hf if isinstance(hf, tuple) else (hf,)


def _as_float32(data: np.ndarray) -> np.ndarray:
    if data.dtype == np.uint16:  # bf16 bits
        return (data.astype(np.uint32) << 16).view(np.float32)
    return data.astype(np.float32)


def _vocabulary(directory: Path, vocab_size: int):
    """(tokens by id, their llama.cpp types, merges) from tokenizer.json; ids past the
    tokenizer's own up to vocab_size become unused [PAD] tokens, as llama.cpp's converter
    pads them."""
    path = directory / "tokenizer.json"
    spec = json.loads(path.read_text())
    model = spec.get("model", {})
    if model.get("type") != "BPE" or (spec.get("decoder") or {}).get("type") != "ByteLevel":
        raise UnsupportedModel(f"{path}: only byte-level BPE tokenizers are written to GGUF")
    by_id = {i: t for t, i in model["vocab"].items()}
    special = set()
    for added in spec.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            special.add(added["id"])
    tokens, types = [], []
    for i in range(vocab_size):
        token = by_id.get(i)
        tokens.append(f"[PAD{i}]" if token is None else token)
        types.append(
            _TOKEN_UNUSED if token is None else _TOKEN_CONTROL if i in special else _TOKEN_NORMAL
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def write_gguf(checkpoint: Path, out: Path, *, float32: bool = False) -> Path:
    """Writes `out` (GGUF, F16 matrices, or F32 with float32) from the HF-format checkpoint
    directory."""
    from gguf import GGMLQuantizationType, GGUFWriter

    from vtllm.models.registry import family, gguf_architecture

    checkpoint = Path(checkpoint)
    config = read_config(checkpoint)
    fam = family(config.architecture)
    scaling = (config.rope_scaling or {}).get("rope_type")
    if scaling not in _SCALINGS.get(fam.name, (None, "llama3")):
        raise UnsupportedModel(f"{checkpoint}: rope scaling {scaling!r} is not written to GGUF")
    source = map_tensors(checkpoint)
    writer = GGUFWriter(str(out), gguf_architecture(fam))
    writer.add_file_type(_ALL_F32 if float32 else _MOSTLY_F16)
    if fam.name in gguf_families.FAMILIES:
        gguf_families.write_metadata(writer, config, fam.name, checkpoint)
    else:
        _write_llama_metadata(writer, config)
    if fam.name in gguf_families.FAMILIES and gguf_spm_vocab.uses_spm(checkpoint, fam.name):
        gguf_spm_vocab.write_spm_vocabulary(writer, checkpoint, config.vocab_size, fam.name)
    else:
        _write_vocabulary(writer, checkpoint, config)
    plan = _plan(config, fam, source)
    missing = [n for _, hf, _, _ in plan for n in _names(hf) if n not in source]
    if missing:
        raise UnsupportedModel(f"{checkpoint}: tensor {missing[0]} is missing")
    matrix = (
        (np.dtype(np.float32), GGMLQuantizationType.F32)
        if float32
        else (np.dtype(np.float16), GGMLQuantizationType.F16)
    )
    f32 = (np.dtype(np.float32), GGMLQuantizationType.F32)
    # kind -> (dtype, GGML type); a "norm" is written as 1 + w (Gemma's convention)
    stored = {"matrix": matrix, "experts": matrix, "vector": f32, "router": f32, "norm": f32}
    for name, hf, kind, _ in plan:
        first = source[_names(hf)[0]].shape
        shape = (len(hf), *first) if kind == "experts" else first
        dtype, raw = stored[kind]
        writer.add_tensor_info(name, shape, dtype, math.prod(shape) * dtype.itemsize, raw_dtype=raw)
    extras = gguf_families.writer_extra_tensors(config)
    if scaling == "llama3":
        extras.append(("rope_freqs.weight", llama3_rope_freqs(config)))
    for name, values in extras:
        writer.add_tensor_info(name, values.shape, values.dtype, values.nbytes, raw_dtype=f32[1])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, hf, kind, heads in plan:
        if kind == "experts":
            data = np.stack([_as_float32(source[n]) for n in hf])
        else:
            data = _as_float32(source[hf])
        if heads is not None:
            data = permute_qk(data, heads)
        if kind == "norm":
            data = data + np.float32(1.0)
        writer.write_tensor_data(data.astype(stored[kind][0]))
    for _, values in extras:
        writer.write_tensor_data(values)
    writer.close()
    return Path(out)


def _plan(config, fam, source):
    if fam.name in gguf_families.FAMILIES:
        return gguf_families.writer_tensors(config, fam.name, source)
    return _tensors(config, fam)


def _write_llama_metadata(writer, config) -> None:
    """The llama / qwen2 / qwen3 / MoE families' keys."""
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_vocab_size(config.vocab_size)
    if config.num_experts:
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        # llama.cpp renormalizes the top-k weights of both families and reads no key for it;
        # vtllm's loader reads this one, so a Qwen3-MoE without norm_topk_prob survives
        writer.add_expert_weights_norm(config.norm_topk_prob)


def _write_vocabulary(writer, checkpoint: Path, config) -> None:
    tokens, types, merges = _vocabulary(checkpoint, config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges or _NO_OP_MERGE)
    if config.bos_token_id is not None:
        writer.add_bos_token_id(config.bos_token_id)
    if config.eos_token_ids:
        writer.add_eos_token_id(config.eos_token_ids[0])
