"""Gemma 2, Gemma 3 and Phi-3 as GGUF (llama.cpp's gemma2 / gemma3 / phi3): the tiny
safetensors checkpoints of tests/models/gemma_tiny.py and phi3_tiny.py written by vtllm's GGUF
writer and read back by its GGUF loader are the same model: the same config, and the same
teacher-forced logits bit for bit (F32 files against the checkpoint; F16 files against the
checkpoint with its matrices stored as F16). That the writer and the loader follow llama.cpp's
conventions, not merely each other's, is checked against llama.cpp's own converter by
tests/goldens/check_gguf_conventions.py."""

import io
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest
import sentencepiece as spm
from safetensors.numpy import save_file

from tests.models import gemma_tiny, phi3_tiny
from tests.models.runner_util import make_runner, teacher_forced_logits
from tests.models.spm_util import training_lines
from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.models import gguf_families
from vtllm.models.gguf_file import GGUFFile
from vtllm.models.gguf_writer import write_gguf
from vtllm.models.loader import load_model
from vtllm.models.synthetic import byte_tokenizer_json

# gemma_tiny's Gemma 2 scales scores by query_pre_attn_scalar 24, which no GGUF key holds
# (llama.cpp scales by head_dim): its GGUF twin is the same checkpoint with head_dim's 16
GEMMA2_GGUF = {**gemma_tiny.CONFIGS["gemma2"], "query_pre_attn_scalar": 16}
CASES = {
    "gemma2": (GEMMA2_GGUF, gemma_tiny),
    "gemma3": (gemma_tiny.CONFIGS["gemma3"], gemma_tiny),
    "phi3": (phi3_tiny.CONFIGS["phi3"], phi3_tiny),
    "phi4mini": (phi3_tiny.CONFIGS["phi4mini"], phi3_tiny),
}
ARCH = {"gemma2": "gemma2", "gemma3": "gemma3", "phi3": "phi3", "phi4mini": "phi3"}


def checkpoint(directory: Path, name: str, *, f16: bool = False, config=None) -> Path:
    """The tiny checkpoint; f16: its matrices stored as F16 (what an F16 GGUF holds)."""
    cfg, tiny = CASES[name]
    cfg = config or cfg
    arrays = tiny.tensors(name)
    if f16:
        arrays = {k: v.astype(np.float16) if v.ndim == 2 else v for k, v in arrays.items()}
    directory.mkdir()
    save_file(arrays, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(cfg))
    vocab = cfg.get("text_config", cfg)["vocab_size"]
    (directory / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(vocab)))
    return directory


def logits(loaded, ids) -> np.ndarray:
    return teacher_forced_logits(make_runner(loaded, max_model_len=64), ids, [len(ids)])


def same_config(gguf, hf) -> None:
    """Every field equal; the epsilon as GGUF holds it (float32)."""
    a, b = msgspec.structs.asdict(gguf), msgspec.structs.asdict(hf)
    assert np.float32(a.pop("rms_norm_eps")) == np.float32(b.pop("rms_norm_eps"))
    assert a == b


@pytest.mark.parametrize("name", sorted(CASES))
def test_f32_copy_is_the_checkpoint(tmp_path, name):
    hf_dir = checkpoint(tmp_path / "hf", name)
    path = write_gguf(hf_dir, tmp_path / "model.gguf", float32=True)
    reader = GGUFFile(path)
    assert reader.fields["general.architecture"] == ARCH[name]
    gguf, hf = load_model(path), load_model(hf_dir)
    same_config(gguf.config, hf.config)
    ids = CASES[name][1].prompt(name)
    assert np.array_equal(logits(gguf, ids), logits(hf, ids))


@pytest.mark.parametrize("name", ["gemma3", "phi4mini"])
def test_f16_copy_is_the_f16_checkpoint(tmp_path, name):
    hf_dir = checkpoint(tmp_path / "hf", name, f16=True)
    path = write_gguf(hf_dir, tmp_path / "model.gguf")
    types = {t.name: t.type for t in GGUFFile(path).tensors}
    assert types["blk.0.ffn_down.weight"] == 1 and types["blk.0.attn_norm.weight"] == 0
    gguf, hf = load_model(path), load_model(hf_dir)
    ids = CASES[name][1].prompt(name)[:24]
    assert np.array_equal(logits(gguf, ids), logits(hf, ids))


def test_gemma_norms_are_stored_as_one_plus_w_and_read_as_is(tmp_path):
    hf_dir = checkpoint(tmp_path / "hf", "gemma3")
    path = write_gguf(hf_dir, tmp_path / "model.gguf", float32=True)
    stored = {t.name: t.data.view(np.float32) for t in GGUFFile(path).tensors}
    w = gemma_tiny.tensors("gemma3")
    for gguf_name, hf_name in [
        ("blk.1.post_ffw_norm.weight", "model.layers.1.post_feedforward_layernorm.weight"),
        ("blk.0.attn_q_norm.weight", "model.layers.0.self_attn.q_norm.weight"),
        ("output_norm.weight", "model.norm.weight"),
    ]:
        assert np.array_equal(stored[gguf_name], w[hf_name] + np.float32(1))
    layer = load_model(path).weights.layers[1]
    assert np.array_equal(layer.post_ffn_norm, stored["blk.1.post_ffw_norm.weight"])


def test_phi3_tensors_are_fused_and_carry_longrope(tmp_path):
    path = write_gguf(checkpoint(tmp_path / "hf", "phi4mini"), tmp_path / "m.gguf")
    reader = GGUFFile(path)
    shapes = {t.name: t.shape for t in reader.tensors}
    cfg = phi3_tiny.CONFIGS["phi4mini"]
    assert shapes["blk.0.attn_qkv.weight"] == (64, 128)  # (hidden, q + k + v rows)
    assert shapes["blk.0.ffn_up.weight"] == (64, 2 * cfg["intermediate_size"])
    assert "blk.0.ffn_gate.weight" not in shapes and "output.weight" not in shapes
    short = next(t for t in reader.tensors if t.name == "rope_factors_short.weight")
    want = np.float32(cfg["rope_scaling"]["short_factor"])
    assert np.array_equal(short.data.view(np.float32), want)
    assert reader.fields["phi3.rope.dimension_count"] == 12
    assert reader.fields["phi3.rope.scaling.original_context_length"] == 128


def test_layer_pattern_and_defaults_as_llama_cpp_reads_them():
    assert gguf_families.sliding_layers(2, 4) == (True, False, True, False)
    assert gguf_families.sliding_layers(6, 7) == (True,) * 5 + (False, True)
    assert gguf_families.sliding_layers([True, False, False], 3) == (True, False, False)
    read = lambda fam, keys, layers=4: gguf_families.config_fields(  # noqa: E731
        fam,
        keys.get,
        lambda n: None,
        Path("m.gguf"),
        layers=layers,
        hidden=64,
        heads=4,
        head_dim=32,
    )
    bare = read("gemma2", {})  # llama.cpp's defaults for a Gemma 2 file without the keys
    assert (bare["sliding_window"], bare["attn_logit_softcap"], bare["final_logit_softcap"]) == (
        4096,
        50.0,
        30.0,
    )
    assert bare["query_pre_attn_scalar"] == 32 and bare["tie_word_embeddings"]
    big = read("gemma2", {}, layers=46)  # the 27B shape: hidden / heads
    assert big["query_pre_attn_scalar"] == 16
    g3 = read("gemma3", {"gemma3.attention.sliding_window": 8}, layers=7)
    assert g3["sliding_layers"] == (True,) * 5 + (False, True)
    assert g3["rope_local_theta"] == 10000.0 and g3["attn_logit_softcap"] == 0.0
    assert read("gemma3", {})["sliding_layers"] == (False,) * 4  # no window key: none
    g3_array = {
        "gemma3.attention.sliding_window": 8,
        "gemma3.attention.sliding_window_pattern": [False, True, True, False],
    }
    assert read("gemma3", g3_array)["sliding_layers"] == (False, True, True, False)


def test_a_multimodal_gemma3_writes_its_text_model(tmp_path):
    text = {k: v for k, v in gemma_tiny.CONFIGS["gemma3"].items() if k != "architectures"}
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "text_config": text}
    hf_dir = checkpoint(tmp_path / "hf", "gemma3", config=cfg)
    arrays = gemma_tiny.tensors("gemma3")
    arrays = {"model.language_model." + k.removeprefix("model."): v for k, v in arrays.items()}
    arrays["model.vision_tower.patch_embedding.weight"] = np.ones((4, 4), np.float32)
    save_file(arrays, str(hf_dir / "model.safetensors"))
    path = write_gguf(hf_dir, tmp_path / "m.gguf", float32=True)
    plain = write_gguf(checkpoint(tmp_path / "plain", "gemma3"), tmp_path / "p.gguf", float32=True)
    names = lambda p: [t.name for t in GGUFFile(p).tensors]  # noqa: E731
    assert names(path) == names(plain)
    ids = gemma_tiny.prompt("gemma3")[:16]
    assert np.array_equal(logits(load_model(path), ids), logits(load_model(plain), ids))


def test_a_pattern_off_the_period_is_written_per_layer(tmp_path):
    types = ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]
    cfg = {**GEMMA2_GGUF, "layer_types": types}
    hf_dir = checkpoint(tmp_path / "hf", "gemma2", config=cfg)
    path = write_gguf(hf_dir, tmp_path / "m.gguf", float32=True)
    assert GGUFFile(path).fields["gemma2.attention.sliding_window_pattern"] == [
        True,
        False,
        False,
        True,
    ]
    assert load_model(path).config.sliding_layers == (True, False, False, True)


def small_spm() -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines(n=300)),
        model_writer=out,
        model_type="bpe",
        vocab_size=200,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return out.getvalue()


@pytest.mark.parametrize("name", ["gemma2", "phi3"])
def test_a_tokenizer_model_is_written_as_the_converters_spm_vocabulary(tmp_path, name):
    hf_dir = checkpoint(tmp_path / "hf", name)
    model = small_spm()
    (hf_dir / "tokenizer.model").write_bytes(model)
    added = {"5": {"content": "<start_of_turn>", "special": True}, "6": {"content": "<unused0>"}}
    config = {"tokenizer_class": "LlamaTokenizer", "added_tokens_decoder": added}
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(config))
    path = write_gguf(hf_dir, tmp_path / "m.gguf")
    fields = GGUFFile(path).fields
    sp = spm.SentencePieceProcessor(model_proto=model)
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    assert fields["tokenizer.ggml.model"] == "llama" and len(tokens) == 320
    assert tokens[10:200] == [sp.id_to_piece(i) for i in range(10, 200)]
    assert (tokens[250], types[250], fields["tokenizer.ggml.scores"][250]) == ("[PAD250]", 5, -1e4)
    assert (tokens[5], types[5]) == ("<start_of_turn>", 3)  # control
    assert types[6] == (3 if name == "gemma2" else 4)  # Gemma: looks special; Phi-3: user-defined
    assert fields.get("tokenizer.ggml.add_space_prefix") == (False if name == "gemma2" else None)
    assert 5 in load_model(path).tokenizer.encode("<start_of_turn>kato")  # a special token


def test_phi3_longrope_needs_both_factor_tensors():
    long = {"rope_factors_long.weight": np.ones(8, np.float32)}
    with pytest.raises(ModelLoadError, match="rope_factors_short.weight: missing"):
        gguf_families.config_fields(
            "phi3", {}.get, long.get, Path("m.gguf"), layers=2, hidden=64, heads=4, head_dim=16
        )


@pytest.mark.parametrize(
    "name,change,message",
    [
        ("gemma2", {"query_pre_attn_scalar": 24}, "query_pre_attn_scalar 24"),
        ("gemma2", {"tie_word_embeddings": False}, "untied lm_head"),
        ("gemma3", {"attn_logit_softcapping": 20.0}, "attn_logit_softcapping"),
    ],
)
def test_what_llama_cpp_could_not_read_back_is_refused(tmp_path, name, change, message):
    cfg = {**CASES[name][0], **change}
    hf_dir = checkpoint(tmp_path / "hf", name, config=cfg)
    with pytest.raises(UnsupportedModel, match=message):
        write_gguf(hf_dir, tmp_path / "m.gguf")
