"""GGUF conventions of Gemma 2, Gemma 3 (text) and Phi-3, as llama.cpp's converter
(convert_hf_to_gguf.py) writes them and llama.cpp reads them: the GGUF loader's and writer's
family-specific half.

Gemma (`gemma2`, `gemma3`):
- every norm weight (the layer's four, the final one, Gemma 3's q/k norms) is stored as 1 + w,
  which is what models/gemma multiplies by: read as is, written as 1 + w (in float32);
- Q/K rows are not permuted (llama.cpp rotates Gemma NEOX-style, HF's rotate-half);
- post-norms are `post_attention_norm` / `post_ffw_norm`; Gemma 2's head is always the
  embedding (llama.cpp reads no `output.weight` for it), Gemma 3's may be `output.weight`;
- there is no query_pre_attn_scalar key: llama.cpp scales scores by head_dim ** -1/2, or by
  (hidden / heads) ** -1/2 on the 27B shapes (Gemma 2: 46 layers, Gemma 3: 62), which is what
  the hub configs' query_pre_attn_scalar says; the writer refuses a config that differs;
- windows: `attention.sliding_window` (Gemma 2: 4096 when absent; Gemma 3: none when absent
  or 0), layers by `attention.sliding_window_pattern` (a bool per layer, or a period n: layer
  i slides unless i % n == n - 1; absent: Gemma 2 2, Gemma 3 6);
- soft-caps: `attn_logit_softcapping` / `final_logit_softcapping` (Gemma 2: 50 / 30 when
  absent; Gemma 3: no score cap, the final one only when the key is there);
- rope: `rope.freq_base` (default 10000) and linear `rope.scaling.factor` for the global
  layers; Gemma 3's sliding layers rotate with `rope.freq_base_swa` (default 10000) unscaled,
  Gemma 2's as the global ones.

Phi-3 (`phi3`): q/k/v fused in `attn_qkv`, gate and up fused in `ffn_up` (gate rows first),
HF's row order (NEOX rope, partial when `rope.dimension_count` < head_dim); longrope is the
presence of `rope_factors_long` / `rope_factors_short` (F32, rotary_dim / 2 each; the
converter writes no rope.scaling.type for phi3) with `rope.scaling.attn_factor` (1 when
absent, as llama.cpp) and `rope.scaling.original_context_length`; `attention.sliding_window`
(0: none) windows every layer, as HF does (llama.cpp ignores it for phi3).
"""

import math
from pathlib import Path

import numpy as np

from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.models.config import ModelConfig
from vtllm.models.phi3_checkpoint import rotary_row_order
from vtllm.models.weights import LayerWeights, Weight

FAMILIES = ("gemma2", "gemma3", "phi3")
_DEFAULT_PATTERN = {"gemma2": 2, "gemma3": 6}
_LARGE_LAYERS = {"gemma2": 46, "gemma3": 62}  # the 27B shapes, scaled by hidden / heads
_GEMMA2_CAPS = (50.0, 30.0)  # llama.cpp's defaults: attention scores, final logits
_ROPE_BASE = 10000.0


def sliding_layers(pattern, layers: int) -> tuple[bool, ...]:
    """Per layer, whether it slides: from a bool per layer or a period n (llama.cpp's
    set_swa_pattern: i % n < n - 1; n = 0: every layer)."""
    if isinstance(pattern, (list, tuple)):
        return tuple(bool(x) for x in pattern[:layers])
    n = int(pattern)
    return tuple(n == 0 or i % n < n - 1 for i in range(layers))


def llama_cpp_attention_scalar(fam: str, layers: int, hidden: int, heads: int, head_dim: int):
    """The query_pre_attn_scalar llama.cpp's Gemma graphs use (no GGUF key holds one)."""
    return float(hidden // heads if layers == _LARGE_LAYERS[fam] else head_dim)


def config_fields(fam: str, get, tensor_values, path: Path, *, layers, hidden, heads, head_dim):
    """ModelConfig fields of the family from GGUF metadata (get(key) -> value or None) and, for
    Phi-3's longrope, its factor tensors (tensor_values(name) -> float32 array or None)."""
    if fam == "phi3":
        return _phi3_fields(get, tensor_values, path, layers=layers, head_dim=head_dim)
    key = lambda name: get(f"{fam}.{name}")  # noqa: E731
    window = key("attention.sliding_window")
    if fam == "gemma2" and window is None:
        window = 4096
    window = int(window or 0)
    pattern = key("attention.sliding_window_pattern")
    slides = sliding_layers(_DEFAULT_PATTERN[fam] if pattern is None else pattern, layers)
    if not window:
        slides = (False,) * layers
    theta = float(key("rope.freq_base") or _ROPE_BASE)
    local = key("rope.freq_base_swa")
    scaled = key("rope.scaling.factor") not in (None, 0.0, 1.0)
    if fam == "gemma2":  # llama.cpp: the sliding layers rotate as the global ones...
        if local is not None and float(local) != theta and scaled:
            raise UnsupportedModel(f"{path}: gemma2 with rope.freq_base_swa and rope scaling")
        local = theta if local is None else float(local)
    else:  # ... Gemma 3's with their own base, unscaled
        local = _ROPE_BASE if local is None else float(local)
    attn_cap, final_cap = _GEMMA2_CAPS if fam == "gemma2" else (0.0, 0.0)
    if fam == "gemma2":
        attn_cap = float(key("attn_logit_softcapping") or attn_cap)
    final_cap = float(key("final_logit_softcapping") or final_cap)
    fields = {
        "sliding_window": window,
        "sliding_layers": slides,
        # models/gemma rotates the sliding layers unscaled with rope_local_theta when set
        "rope_local_theta": local if any(slides) and (local != theta or fam == "gemma3") else 0.0,
        "query_pre_attn_scalar": llama_cpp_attention_scalar(fam, layers, hidden, heads, head_dim),
        "attn_logit_softcap": attn_cap,
        "final_logit_softcap": final_cap,
    }
    if fam == "gemma2":
        fields["tie_word_embeddings"] = True
    return fields


def _phi3_fields(get, tensor_values, path: Path, *, layers: int, head_dim: int) -> dict:
    rotary_dim = int(get("phi3.rope.dimension_count") or head_dim)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise UnsupportedModel(f"{path}: phi3.rope.dimension_count {rotary_dim} (head {head_dim})")
    window = int(get("phi3.attention.sliding_window") or 0)
    fields = {
        "rotary_dim": 0 if rotary_dim == head_dim else rotary_dim,
        "sliding_window": window,
        "sliding_layers": (bool(window),) * layers,
        "rope_scaling": None,
    }
    long = tensor_values("rope_factors_long.weight")
    short = tensor_values("rope_factors_short.weight")
    if long is None and short is None:
        return fields
    for name, factors in (("rope_factors_long", long), ("rope_factors_short", short)):
        if factors is None or factors.shape != (rotary_dim // 2,):
            got = "missing" if factors is None else f"shape {factors.shape}"
            raise ModelLoadError(f"{path}: tensor {name}.weight: {got}, want ({rotary_dim // 2},)")
    context = int(get("phi3.context_length") or 4096)
    original = int(get("phi3.rope.scaling.original_context_length") or context)
    scaling_ratio = context / original
    fields["rope_scaling"] = {
        "rope_type": "longrope",
        "short_factor": [float(f) for f in short],
        "long_factor": [float(f) for f in long],
        "original_max_position_embeddings": original,
        "factor": scaling_ratio,
        "attention_factor": _attention_factor(
            get("phi3.rope.scaling.attn_factor"), scaling_ratio, original
        ),
    }
    return fields


def _attention_factor(stored, ratio: float, original: int):
    """The key's value (1 when absent, as llama.cpp), or None where it is HF's derived
    sqrt(1 + ln(ratio) / ln(original)) to float32 precision: rope_table then derives it in
    float64, as the HF loader does, so the table's bits are the safetensors checkpoint's."""
    if stored is None:
        return 1.0
    derived = math.sqrt(1 + math.log(ratio) / math.log(original)) if ratio > 1 else 1.0
    return None if np.float32(derived) == np.float32(stored) else float(stored)


def load_layer(config: ModelConfig, i: int, names: set, matrix, vector, fuse) -> LayerWeights:
    """Layer i's weights; matrix / vector / fuse: the GGUF loader's readers by name."""
    p = f"blk.{i}."
    if config.architecture == "phi3":
        return _phi3_layer(config, p, names, matrix, vector, fuse)
    qkv = fuse([matrix(p + f"attn_{n}.weight") for n in "qkv"])
    return LayerWeights(
        attn_norm=vector(p + "attn_norm.weight"),
        qkv=qkv,
        o=matrix(p + "attn_output.weight"),
        ffn_norm=vector(p + "ffn_norm.weight"),
        gate_up=fuse([matrix(p + "ffn_gate.weight"), matrix(p + "ffn_up.weight")]),
        down=matrix(p + "ffn_down.weight"),
        q_norm=vector(p + "attn_q_norm.weight") if config.qk_norm else None,
        k_norm=vector(p + "attn_k_norm.weight") if config.qk_norm else None,
        post_attn_norm=vector(p + "post_attention_norm.weight"),
        post_ffn_norm=vector(p + "post_ffw_norm.weight"),
    )


def _phi3_layer(config: ModelConfig, p: str, names: set, matrix, vector, fuse) -> LayerWeights:
    if p + "attn_qkv.weight" in names:
        qkv = [matrix(p + "attn_qkv.weight")]
    else:
        qkv = fuse([matrix(p + f"attn_{n}.weight") for n in "qkv"])
    rows = config.q_size + 2 * config.kv_size
    gate_up = matrix(p + "ffn_up.weight")
    if sum(w.shape[0] for w in qkv) != rows or gate_up.shape[0] != 2 * config.intermediate_size:
        raise ModelLoadError(
            f"{p}attn_qkv / ffn_up: {[w.shape for w in qkv]} / {gate_up.shape} do not fit the "
            f"config ({rows}, {2 * config.intermediate_size} rows)"
        )
    if config.rotary_dim:
        qkv = _rotary_reorder(qkv, config)
    return LayerWeights(
        attn_norm=vector(p + "attn_norm.weight"),
        qkv=qkv,
        o=matrix(p + "attn_output.weight"),
        ffn_norm=vector(p + "ffn_norm.weight"),
        gate_up=[gate_up],
        down=matrix(p + "ffn_down.weight"),
    )


def _rotary_reorder(qkv: list[Weight], config: ModelConfig) -> list[Weight]:
    """Each q and k head's rows in phi3_checkpoint's rotary order (the pairs the kernels
    rotate), whether q/k/v come fused or apart; v untouched."""
    dim, order = config.head_dim, rotary_row_order(config.head_dim, config.rotary_dim)
    heads = config.num_heads + config.num_kv_heads
    rows = (np.arange(heads)[:, None] * dim + order).reshape(-1)
    total = sum(w.shape[0] for w in qkv)
    rows = np.concatenate([rows, np.arange(heads * dim, total)])
    out, start = [], 0
    for w in qkv:  # apart: q's rows stay in q, k's in k (head boundaries are part boundaries)
        part = rows[start : start + w.shape[0]] - start
        out.append(Weight(np.ascontiguousarray(w.data[part]), w.qtype, w.shape))
        start += w.shape[0]
    return out


# ---- the writer's half ----------------------------------------------------------------


# where a text model's tensors sit: Gemma*ForCausalLM, then Gemma3ForConditionalGeneration as
# transformers >= 4.52 and older ones save it (gemma_checkpoint reads the same three)
_PREFIXES = ("model.", "model.language_model.", "language_model.model.")


def writer_tensors(config: ModelConfig, fam: str, hf_names) -> list[tuple]:
    """(GGUF name, HF name, kind, None) in file order, as gguf_writer's plan: kind "matrix"
    (the chosen float type), "vector" (F32) or "norm" (F32, stored as 1 + w). hf_names: the
    checkpoint's tensor names (a multimodal Gemma 3's text model sits under its own prefix;
    its vision tower is not written, as the converter leaves it to the mmproj file)."""
    norm = "norm" if fam != "phi3" else "vector"
    pre = next((p for p in _PREFIXES if p + "embed_tokens.weight" in hf_names), "model.")
    out = [("token_embd.weight", pre + "embed_tokens.weight", "matrix", None)]
    for i in range(config.num_layers):
        g, h = f"blk.{i}.", f"{pre}layers.{i}."
        out.append((g + "attn_norm.weight", h + "input_layernorm.weight", norm, None))
        if fam == "phi3":
            out += [
                (g + "attn_qkv.weight", h + "self_attn.qkv_proj.weight", "matrix", None),
                (g + "attn_output.weight", h + "self_attn.o_proj.weight", "matrix", None),
                (g + "ffn_norm.weight", h + "post_attention_layernorm.weight", norm, None),
                (g + "ffn_up.weight", h + "mlp.gate_up_proj.weight", "matrix", None),
                (g + "ffn_down.weight", h + "mlp.down_proj.weight", "matrix", None),
            ]
            continue
        out += [
            (g + f"attn_{n}.weight", h + f"self_attn.{n}_proj.weight", "matrix", None)
            for n in "qkv"
        ]
        if config.qk_norm:
            out += [
                (g + "attn_q_norm.weight", h + "self_attn.q_norm.weight", norm, None),
                (g + "attn_k_norm.weight", h + "self_attn.k_norm.weight", norm, None),
            ]
        out += [
            (g + "attn_output.weight", h + "self_attn.o_proj.weight", "matrix", None),
            (g + "post_attention_norm.weight", h + "post_attention_layernorm.weight", norm, None),
            (g + "ffn_norm.weight", h + "pre_feedforward_layernorm.weight", norm, None),
            (g + "ffn_gate.weight", h + "mlp.gate_proj.weight", "matrix", None),
            (g + "ffn_up.weight", h + "mlp.up_proj.weight", "matrix", None),
            (g + "ffn_down.weight", h + "mlp.down_proj.weight", "matrix", None),
            (g + "post_ffw_norm.weight", h + "post_feedforward_layernorm.weight", norm, None),
        ]
    out.append(("output_norm.weight", pre + "norm.weight", norm, None))
    if not config.tie_word_embeddings:
        head = "language_model.lm_head.weight" if pre == _PREFIXES[2] else "lm_head.weight"
        out.append(("output.weight", head, "matrix", None))
    return out


def writer_extra_tensors(config: ModelConfig) -> list[tuple[str, np.ndarray]]:
    """Phi-3's longrope factors (F32), which the converter writes from the config."""
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type") != "longrope":
        return []
    return [
        ("rope_factors_long.weight", np.array(scaling["long_factor"], np.float32)),
        ("rope_factors_short.weight", np.array(scaling["short_factor"], np.float32)),
    ]


def write_metadata(writer, config: ModelConfig, fam: str, path: Path) -> None:
    """The architecture's keys as the converter's Gemma2Model / Gemma3Model / Phi3MiniModel
    write them; refuses what llama.cpp could not read back as the same model."""
    c = config
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    if fam == "phi3":
        _phi3_metadata(writer, c, path)
        return
    _check_gemma(c, fam, path)
    writer.add_key_length(c.head_dim)
    writer.add_value_length(c.head_dim)
    slides = any(c.sliding_layers) and c.sliding_window
    if fam == "gemma2":
        if c.rope_theta != _ROPE_BASE:  # the converter writes no base: llama.cpp's 10000
            writer.add_rope_freq_base(c.rope_theta)
        writer.add_attn_logit_softcapping(c.attn_logit_softcap)
        writer.add_final_logit_softcapping(c.final_logit_softcap)
        writer.add_sliding_window(c.sliding_window)
    else:
        scaling = c.rope_scaling or {}
        if scaling.get("rope_type") == "linear":
            writer.add_rope_scaling_type(_linear_scaling_type())
            writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_freq_base(c.rope_theta)
        if slides:
            writer.add_rope_freq_base_swa(c.rope_local_theta or c.rope_theta)
        if c.final_logit_softcap:
            writer.add_final_logit_softcapping(c.final_logit_softcap)
        if slides:
            writer.add_sliding_window(c.sliding_window)
    if slides and c.sliding_layers != sliding_layers(_DEFAULT_PATTERN[fam], c.num_layers):
        # not the family's period: llama.cpp reads a bool per layer (the converter writes none)
        writer.add_sliding_window_pattern(list(c.sliding_layers))


def _linear_scaling_type():
    from gguf import RopeScalingType

    return RopeScalingType.LINEAR


def _check_gemma(c: ModelConfig, fam: str, path: Path) -> None:
    want = llama_cpp_attention_scalar(fam, c.num_layers, c.hidden_size, c.num_heads, c.head_dim)
    if c.query_pre_attn_scalar and c.query_pre_attn_scalar != want:
        raise UnsupportedModel(
            f"{path}: query_pre_attn_scalar {c.query_pre_attn_scalar:g}: llama.cpp's {fam} "
            f"scales by {want:g} and GGUF has no key for it"
        )
    if c.qkv_bias:
        raise UnsupportedModel(f"{path}: {fam} attention biases are not written to GGUF")
    if fam == "gemma2":
        if not c.tie_word_embeddings:
            raise UnsupportedModel(f"{path}: gemma2 with an untied lm_head (llama.cpp ties it)")
        if not (c.attn_logit_softcap and c.final_logit_softcap):
            raise UnsupportedModel(f"{path}: gemma2 without soft-caps (llama.cpp always caps)")
        if c.rope_local_theta or c.rope_scaling:
            raise UnsupportedModel(f"{path}: gemma2 rope scaling or a local rope base")
    elif c.attn_logit_softcap:
        raise UnsupportedModel(f"{path}: gemma3 attn_logit_softcapping (llama.cpp has none)")


def _phi3_metadata(writer, c: ModelConfig, path: Path) -> None:
    scaling = c.rope_scaling or {}
    original = scaling.get("original_max_position_embeddings", c.max_position_embeddings)
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_rope_dimension_count(c.rotary_dim or c.head_dim)
    writer.add_rope_freq_base(c.rope_theta)
    if c.sliding_window and not all(c.sliding_layers):
        raise UnsupportedModel(f"{path}: phi3 with a window on some layers only")
    writer.add_sliding_window(c.sliding_window)
    if scaling.get("rope_type") == "longrope":
        from vtllm.kernels.rope_table import rope_attention_factor

        # HF's factor: the converter's sqrt(1 + ln(s) / ln(original)), s = context / original,
        # unless the config names its own attention_factor
        writer.add_rope_scaling_attn_factors(rope_attention_factor(scaling))
    elif scaling:
        raise UnsupportedModel(f"{path}: phi3 rope scaling {scaling.get('rope_type')!r}")
    if c.head_dim * c.num_heads != c.hidden_size:
        raise UnsupportedModel(f"{path}: phi3 head_dim {c.head_dim} != hidden / heads")
