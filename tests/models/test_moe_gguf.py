"""MoE checkpoints as GGUF (llama.cpp's names: qwen3moe; Mixtral as llama with experts; each
layer's experts as 3-D ffn_{gate,up,down}_exps tensors, its router as ffn_gate_inp): written by
vtllm's GGUF writer from the tiny safetensors checkpoints of tests/models/moe_tiny.py and read
back by its GGUF loader, they are the same model, bit for bit, as the checkpoint with its
matrices rounded to F16 (what the GGUF holds; the router stays F32)."""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.models import moe_tiny
from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm.errors import UnsupportedModel
from vtllm.models.gguf_file import GGUFFile
from vtllm.models.gguf_writer import write_gguf
from vtllm.models.loader import load_model
from vtllm.models.moe_checkpoint import gguf_config_fields
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors


def _f16_checkpoint(directory: Path, name: str) -> Path:
    """The tiny checkpoint with every matrix but the routers rounded to F16 values."""
    arrays = {
        k: v.astype(np.float16).astype(np.float32)
        if v.ndim == 2 and not k.endswith(".gate.weight")
        else v
        for k, v in moe_tiny.tensors(name).items()
    }
    directory.mkdir()
    save_safetensors(directory / "model.safetensors", arrays)
    (directory / "config.json").write_text(json.dumps(moe_tiny.CONFIGS[name]))
    vocab = moe_tiny.CONFIGS[name]["vocab_size"]
    (directory / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(vocab)))
    return directory


@pytest.mark.parametrize("name,arch", [("qwen3_moe_step2", "qwen3moe"), ("mixtral", "llama")])
def test_gguf_copy_is_the_f16_checkpoint(tmp_path, name, arch):
    checkpoint = _f16_checkpoint(tmp_path / "hf", name)
    path = write_gguf(checkpoint, tmp_path / "model.gguf")
    fields = GGUFFile(path).fields
    cfg = moe_tiny.CONFIGS[name]
    experts = cfg.get("num_experts") or cfg.get("num_local_experts")
    assert fields["general.architecture"] == arch
    assert fields[f"{arch}.expert_count"] == experts
    assert fields[f"{arch}.expert_used_count"] == cfg["num_experts_per_tok"]
    shapes = {t.name: t.shape for t in GGUFFile(path).tensors}
    width = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    assert shapes["blk.1.ffn_gate_exps.weight"] == (cfg["hidden_size"], width, experts)
    assert shapes["blk.1.ffn_down_exps.weight"] == (width, cfg["hidden_size"], experts)
    gguf, hf = load_model(path), load_model(checkpoint)
    assert gguf.config.architecture == hf.config.architecture
    layers = range(cfg["num_hidden_layers"])
    assert [gguf.config.is_moe_layer(i) for i in layers] == moe_tiny.sparse_layers(cfg)
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"):
        assert getattr(gguf.config, key) == getattr(hf.config, key), key
    ids = moe_tiny.prompt(name)[:24]
    ours = teacher_forced_logits(make_runner(gguf, max_model_len=32), ids, [len(ids)])
    want = teacher_forced_logits(make_runner(hf, max_model_len=32), ids, [len(ids)])
    assert np.array_equal(ours, want)


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"qwen3moe.expert_shared_count": 1}, "shared expert"),
        ({"qwen3moe.expert_gating_func": 2}, "expert_gating_func 2"),
        ({"qwen3moe.expert_used_count": 9}, "expert_used_count 9 of 8"),
    ],
)
def test_gguf_expert_settings_not_implemented_are_refused(extra, message):
    fields = {"qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2, **extra}
    names = {f"blk.{i}.ffn_gate_inp.weight" for i in range(2)}
    with pytest.raises(UnsupportedModel, match=message):
        gguf_config_fields(fields.get, "qwen3moe", names, 2, Path("m.gguf"))
    dense = gguf_config_fields({"llama.block_count": 2}.get, "llama", set(), 2, Path("m.gguf"))
    assert dense == {}
