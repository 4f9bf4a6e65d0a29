"""GGUF files written here from a tiny checkpoint: every storage type, llama.cpp's Q/K row
permutation, tied embeddings, and the errors for what is not supported."""

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from tests.models.reference_forward import reference_logits
from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.kernels import QType
from vtllm.kernels.cpu.quant import dequantize, quantize
from vtllm.models.gguf_writer import permute_qk
from vtllm.models.loader import load_model
from vtllm.models.synthetic import hf_config, random_weights, save_safetensors, write_checkpoint

_GGML = {
    QType.F32: GGMLQuantizationType.F32,
    QType.F16: GGMLQuantizationType.F16,
    QType.Q4_0: GGMLQuantizationType.Q4_0,
    QType.Q8_0: GGMLQuantizationType.Q8_0,
    QType.Q4_1: GGMLQuantizationType.Q4_1,
}


def _stored(w, qtype):
    """(bytes for the file, the float matrix a reader dequantizes them to)."""
    if qtype == QType.F32:
        return w, w
    if qtype == QType.F16:
        return w.astype(np.float16), w.astype(np.float16).astype(np.float32)
    blocks = quantize(w, qtype)
    return blocks, dequantize(blocks, qtype)


def write_tiny_gguf(directory, qtype, *, arch="llama", extra_tensor=None):
    cfg = hf_config("tiny", tie=True)
    weights = random_weights(cfg, seed=9)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    path = directory / f"tiny-{qtype.name}.gguf"
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    tok = json.loads(
        (write_checkpoint(directory / "hf", "tiny")).joinpath("tokenizer.json").read_text()
    )
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([3 if i < 3 else 1 for i in range(len(vocab))])
    writer.add_token_merges([])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    effective = {}

    def put(name, hf_name, w, *, permute_heads=None, as_type=qtype):
        stored, used = _stored(w, as_type)
        effective[hf_name] = used
        if permute_heads:
            stored = permute_qk(stored, permute_heads)
        writer.add_tensor(name, stored, raw_dtype=_GGML[as_type])

    put("token_embd.weight", "model.embed_tokens.weight", weights["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        put(
            p + "attn_norm.weight",
            h + "input_layernorm.weight",
            weights[h + "input_layernorm.weight"],
            as_type=QType.F32,
        )
        put(
            p + "ffn_norm.weight",
            h + "post_attention_layernorm.weight",
            weights[h + "post_attention_layernorm.weight"],
            as_type=QType.F32,
        )
        for short, name, perm in (
            ("q", "attn_q", heads),
            ("k", "attn_k", kv_heads),
            ("v", "attn_v", None),
            ("o", "attn_output", None),
        ):
            hf = h + f"self_attn.{short}_proj.weight"
            put(p + name + ".weight", hf, weights[hf], permute_heads=perm)
        for short, name in (("gate", "ffn_gate"), ("up", "ffn_up"), ("down", "ffn_down")):
            hf = h + f"mlp.{short}_proj.weight"
            put(p + name + ".weight", hf, weights[hf])
    put("output_norm.weight", "model.norm.weight", weights["model.norm.weight"], as_type=QType.F32)
    if extra_tensor is not None:
        writer.add_tensor(*extra_tensor[:2], raw_dtype=extra_tensor[2])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reference_dir = directory / f"ref-{qtype.name}"
    reference_dir.mkdir()
    (reference_dir / "config.json").write_text(json.dumps(cfg))
    save_safetensors(reference_dir / "model.safetensors", effective)
    return path, reference_dir


@pytest.mark.parametrize("qtype", [QType.F32, QType.F16, QType.Q8_0, QType.Q4_0, QType.Q4_1])
def test_gguf_logits_match_reference_of_dequantized_weights(tmp_path, qtype):
    path, reference_dir = write_tiny_gguf(tmp_path, qtype)
    loaded = load_model(path)
    assert loaded.config.tie_word_embeddings and loaded.weights.lm_head is loaded.weights.embed
    ids = np.random.default_rng(2).integers(3, 512, 30).tolist()
    ours = teacher_forced_logits(make_runner(loaded), ids, [30])
    ref = reference_logits(reference_dir, ids)
    assert np.max(np.abs(ours - ref) / np.abs(ref).max(axis=1, keepdims=True)) < 1e-4


def test_unsupported_quant_type_is_named(tmp_path):
    iq2 = (np.zeros((64, 66), np.uint8), GGMLQuantizationType.IQ2_XXS)
    path, _ = write_tiny_gguf(tmp_path, QType.F32, extra_tensor=("output.weight", *iq2))
    with pytest.raises(UnsupportedModel, match="output.weight.*IQ2_XXS"):
        load_model(path)


def test_unsupported_architecture_is_named(tmp_path):
    path, _ = write_tiny_gguf(tmp_path, QType.F32, arch="gpt2")
    with pytest.raises(UnsupportedModel, match="gpt2"):
        load_model(path)
    hf = write_checkpoint(tmp_path / "hf2", "tiny")
    cfg = json.loads((hf / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModel, match="Mamba"):
        load_model(hf)


def test_truncated_gguf_is_a_load_error(tmp_path):
    path, _ = write_tiny_gguf(tmp_path, QType.Q8_0)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="past the end"):
        load_model(path)
