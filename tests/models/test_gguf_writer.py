"""GGUF copies of synthetic checkpoints (the llama.cpp peer's files): read back through
vtllm's GGUF loader they are the same model as the checkpoint with its matrices rounded to
F16, for each family, and llama3 rope scaling survives as llama.cpp's frequency divisors."""

import json

import numpy as np
import pytest

from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm.errors import UnsupportedModel
from vtllm.kernels import cpu as ops
from vtllm.models.gguf_writer import write_gguf
from vtllm.models.llama import rope_table
from vtllm.models.loader import load_model
from vtllm.models.safetensors_loader import map_tensors
from vtllm.models.synthetic import save_safetensors, write_checkpoint

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 1024,
}


def _f16_reference(checkpoint, out):
    """The checkpoint with every matrix rounded to F16 (what the GGUF holds), as float32."""
    out.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((checkpoint / name).read_bytes())
    tensors = {}
    for name, data in map_tensors(checkpoint).items():
        x = np.asarray(data, np.float32)
        tensors[name] = x.astype(np.float16).astype(np.float32) if x.ndim == 2 else x
    save_safetensors(out / "model.safetensors", tensors)
    return out


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen2", "tiny-qwen3", "tiny-llama3-rope"])
def test_gguf_copy_is_the_f16_rounded_checkpoint(tmp_path, shape):
    checkpoint = write_checkpoint(
        tmp_path / "hf", "tiny" if shape == "tiny-llama3-rope" else shape, seed=3
    )
    if shape == "tiny-llama3-rope":
        config = json.loads((checkpoint / "config.json").read_text())
        config["rope_scaling"] = LLAMA3_SCALING
        (checkpoint / "config.json").write_text(json.dumps(config))
    gguf = load_model(write_gguf(checkpoint, tmp_path / "model.gguf"))
    reference = load_model(_f16_reference(checkpoint, tmp_path / "ref"))
    assert gguf.config.architecture == reference.config.architecture
    assert gguf.config.vocab_size == reference.config.vocab_size == 512
    assert gguf.config.eos_token_ids == reference.config.eos_token_ids == (2,)
    assert gguf.tokenizer.decode(list(range(3, 300))) == reference.tokenizer.decode(
        list(range(3, 300))
    )
    text = "hello!! world!!! ünïcode"  # "!!": the merge llama.cpp needs is no token
    assert gguf.tokenizer.encode(text) == reference.tokenizer.encode(text)
    ids = np.random.default_rng(4).integers(3, 512, 40).tolist()
    ours = teacher_forced_logits(make_runner(gguf), ids, [40])
    ref = teacher_forced_logits(make_runner(reference), ids, [40])
    assert np.max(np.abs(ours - ref) / np.abs(ref).max(axis=1, keepdims=True)) < 1e-5
    # positions far past the test's: the GGUF's rotation is the checkpoint's rope scaling
    table = rope_table(gguf.config, gguf.weights, 4096, ops)
    expected = rope_table(reference.config, reference.weights, 4096, ops)
    np.testing.assert_allclose(table, expected, atol=2e-4)
    assert (gguf.weights.rope_freq_factors is not None) == (shape == "tiny-llama3-rope")


def test_a_tokenizer_that_is_not_byte_level_bpe_is_refused(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "hf", "tiny")
    spec = json.loads((checkpoint / "tokenizer.json").read_text())
    spec["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"}
    (checkpoint / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(UnsupportedModel, match="byte-level BPE"):
        write_gguf(checkpoint, tmp_path / "model.gguf")
