"""Phi-3 (and the sliding windows of Mistral and Qwen2) against HF transformers: tiny random
checkpoints drawn from a seed (tests/models/phi3_tiny.py), HF's logits and greedy tokens of them
committed in tests/goldens/phi3_references.json (tests/goldens/make_phi3_references.py made
them)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.models import phi3_tiny
from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm.errors import UnsupportedModel
from vtllm.executor.cpu_ops import CpuOps
from vtllm.kernels import cpu as kernels
from vtllm.kernels.rope_table import rope_cos_sin
from vtllm.models import phi3_checkpoint, registry, safetensors_loader
from vtllm.models.llama import LlamaModel
from vtllm.models.loader import load_model
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors

REFS = json.loads((Path(__file__).parents[1] / "goldens/phi3_references.json").read_text())
MAX_MODEL_LEN = 96  # under original_max_position_embeddings (128): the short factors


def write(directory: Path, name: str, config: dict | None = None) -> Path:
    save_safetensors(directory / "model.safetensors", phi3_tiny.tensors(name))
    (directory / "config.json").write_text(json.dumps(config or phi3_tiny.CONFIGS[name]))
    vocab = phi3_tiny.CONFIGS[name]["vocab_size"]
    (directory / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(vocab)))
    return directory


def read(config: dict):
    fam = registry.family_for_hf(config["architectures"])
    return phi3_checkpoint.read_config(config, fam, Path("config.json"))


@pytest.fixture(scope="module", params=sorted(phi3_tiny.CONFIGS))
def model(request, tmp_path_factory):
    name = request.param
    ref = REFS["models"][name]
    assert phi3_tiny.digest(phi3_tiny.tensors(name)) == ref["weights_sha256"]
    loaded = load_model(write(tmp_path_factory.mktemp(name), name))
    runner = make_runner(loaded, num_blocks=40, max_model_len=MAX_MODEL_LEN)
    return name, ref, runner


def test_logits_match_hf(model):
    _, ref, runner = model
    ids = ref["prompt_ids"] + ref["output_ids"]
    ours = teacher_forced_logits(runner, ids, [len(ids)])
    top, want = np.array(ref["top_ids"]), np.array(ref["top_logits"], np.float32)
    got = np.take_along_axis(ours, top, axis=1)
    scale = np.abs(want).max(axis=1, keepdims=True)
    assert np.max(np.abs(got - want) / scale) < 1e-5
    clear = np.array(ref["margins"]) > 1e-2
    assert clear.mean() > 0.95
    assert np.array_equal(ours.argmax(1)[clear], top[clear, 0])


def test_greedy_matches_hf_and_chunks_are_invisible(model):
    name, ref, runner = model
    prompt, out = ref["prompt_ids"], ref["output_ids"]
    ids = prompt + out
    window = phi3_tiny.CONFIGS[name]["sliding_window"] or 0
    windowed = [False, True, True] if name == "qwen2window" else [bool(window)] * 3
    assert window < len(prompt)
    assert [spec is not None for spec in runner.model.window_specs] == windowed
    decode = teacher_forced_logits(runner, ids, [len(prompt)] + [1] * len(out))
    assert decode[len(prompt) - 1 : -1].argmax(1).tolist() == out
    whole = teacher_forced_logits(runner, ids, [len(ids)])
    chunked = teacher_forced_logits(runner, ids, [5, 11, 3, 17, 9, 27])
    assert np.array_equal(whole, decode)
    assert np.array_equal(whole, chunked)


def test_config_fields():
    phi3 = read(phi3_tiny.CONFIGS["phi3"])
    assert (phi3.architecture, phi3.rotary_dim, phi3.sliding_window) == ("phi3", 0, 12)
    assert phi3.sliding_layers == (True,) * 3 and not phi3.tie_word_embeddings
    scaling = phi3.rope_scaling
    assert scaling["rope_type"] == "longrope" and scaling["factor"] == 4.0  # 512 / 128
    assert scaling["original_max_position_embeddings"] == 128
    mini = read(phi3_tiny.CONFIGS["phi4mini"])
    assert (mini.rotary_dim, mini.sliding_window, mini.tie_word_embeddings) == (12, 0, True)
    # transformers 5 saves rope_parameters: the same config
    raw = {k: v for k, v in phi3_tiny.CONFIGS["phi4mini"].items() if k != "rope_scaling"}
    raw["rope_parameters"] = {
        **phi3_tiny.CONFIGS["phi4mini"]["rope_scaling"],
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75,
        "original_max_position_embeddings": 128,
    }
    del raw["rope_parameters"]["type"]
    assert read(raw) == mini


def test_longrope_table_is_chosen_once_by_the_model_length(tmp_path):
    """Short factors while the engine's sequences fit original_max_position_embeddings, long
    ones beyond (HF would switch the whole sequence there, which a paged cache cannot redo);
    cos and sin times the attention factor either way."""
    c = read(phi3_tiny.CONFIGS["phi3"])
    s = c.rope_scaling
    attn = math.sqrt(1 + math.log(4.0) / math.log(128))
    inv = 1.0 / 10000.0 ** (np.arange(0, 16, 2) / 16)
    pos = np.arange(300, dtype=np.float64)[:, None]
    for context, key in ((128, "short_factor"), (129, "long_factor"), (None, "short_factor")):
        got = rope_cos_sin(300, 16, c.rope_theta, scaling=s, context_len=context)
        freqs = pos * inv / np.array(s[key])
        want = np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1) * attn
        assert np.array_equal(got, want.astype(np.float32)), context
    explicit = rope_cos_sin(8, 16, 1e4, scaling={**s, "attention_factor": 1.5})
    plain = rope_cos_sin(8, 16, 1e4, scaling={**s, "attention_factor": 1.0})
    assert np.allclose(explicit, 1.5 * plain, rtol=1e-6, atol=0)
    # the model's table: runners ask for max_model_len + 1 rows
    loaded = load_model(write(tmp_path, "phi3"))
    for max_model_len, key in ((128, "short_factor"), (129, "long_factor")):
        ops = CpuOps(kernels, loaded.config)
        LlamaModel(loaded.config, loaded.weights, ops, max_model_len + 1)
        freqs = np.arange(max_model_len + 1.0)[:, None] * inv / np.array(s[key])
        want = np.concatenate([np.cos(freqs), np.sin(freqs)], axis=1) * attn
        assert np.array_equal(ops.cos_sin, want.astype(np.float32)), max_model_len


def test_partial_rotary_table_and_row_order():
    table = rope_cos_sin(8, 16, 1e4, rotary_dim=12)
    full = rope_cos_sin(8, 12, 1e4)
    assert np.array_equal(table[:, :6], full[:, :6]) and np.array_equal(table[:, 8:14], full[:, 6:])
    assert (table[:, 6:8] == 1).all() and (table[:, 14:] == 0).all()
    order = phi3_checkpoint.rotary_row_order(16, 12)
    assert order.tolist() == [0, 1, 2, 3, 4, 5, 12, 13, 6, 7, 8, 9, 10, 11, 14, 15]
    # rotating the reordered head with our kernel is HF's partial rotation, reordered
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 1, 16)).astype(np.float32)
    pos = np.array([0, 7, 4], np.int32)
    ours_q, ours_k = x[:, :, order].copy(), x[:, :, order].copy()
    kernels.rotary(ours_q, ours_k, pos, table)
    cos, sin = full[pos, :6][:, None], full[pos, 6:][:, None]
    x1, x2, rest = x[..., :6], x[..., 6:12], x[..., 12:]
    hf = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
    assert np.allclose(ours_q, hf[:, :, order], rtol=1e-6, atol=1e-6)


def test_window_only_where_it_bites(tmp_path):
    """A window no shorter than max_model_len runs the plain attention (and the fused fast
    layer); a backend without windowed attention refuses a window that matters."""
    loaded = load_model(write(tmp_path, "mistral"))
    assert loaded.config.sliding_window == 10
    ops = CpuOps(kernels, loaded.config)
    assert LlamaModel(loaded.config, loaded.weights, ops, 11).window_specs == [None] * 3
    assert None not in LlamaModel(loaded.config, loaded.weights, ops, 12).window_specs

    class NoWindowOps(CpuOps):
        attention_spec = property()  # a backend without windowed attention

    with pytest.raises(UnsupportedModel, match="sliding_window 10"):
        LlamaModel(loaded.config, loaded.weights, NoWindowOps(kernels, loaded.config), 64)
    qwen2 = {**phi3_tiny.CONFIGS["mistral"], "architectures": ["Qwen2ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(qwen2))
    assert safetensors_loader.read_config(tmp_path).sliding_window == 0  # use_sliding_window


def test_qwen_window_layers_follow_hf(tmp_path):
    """Qwen2 / Qwen3 window the layers layer_types names, else those from max_window_layers
    on (HF's rule); use_sliding_window off, or no layer left windowed: no window."""
    base = phi3_tiny.CONFIGS["qwen2window"]

    def layers(**change):
        (tmp_path / "config.json").write_text(json.dumps({**base, **change}))
        c = safetensors_loader.read_config(tmp_path)
        return c.sliding_window, c.sliding_layers

    assert layers() == (10, (False, True, True))
    assert layers(architectures=["Qwen3ForCausalLM"], max_window_layers=2) == (
        10,
        (False, False, True),
    )
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    assert layers(layer_types=types) == (10, (True, False, True))
    assert layers(use_sliding_window=False) == (0, (False,) * 3)
    assert layers(max_window_layers=3) == (0, (False,) * 3)
    with pytest.raises(UnsupportedModel, match="layer_types has 2 entries for 3 layers"):
        layers(layer_types=types[:2])


@pytest.mark.parametrize(
    "change,message",
    [
        ({"rope_scaling": {"type": "yarn", "factor": 2.0}}, "rope scaling 'yarn'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"partial_rotary_factor": 0.3125}, "partial_rotary_factor 0.3125"),
        (
            {"rope_scaling": {"type": "su", "short_factor": [1.0], "long_factor": [1.0]}},
            "short_factor has 1 values",
        ),
    ],
)
def test_refusals_name_the_field(change, message):
    with pytest.raises(UnsupportedModel, match=message):
        read({**phi3_tiny.CONFIGS["phi3"], **change})


def test_registry():
    assert registry.family_for_hf(["Phi3ForCausalLM"]).name == "phi3"
    assert registry.model_class("phi3") is LlamaModel
    assert registry.family("phi3").name == "phi3"  # GGUF: tests/models/test_gguf_families
    registry.check_cuda("phi3")  # the CUDA backend has windowed attention
