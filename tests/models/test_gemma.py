"""Gemma 2 and Gemma 3 (text) against HF transformers: tiny random checkpoints drawn from a
seed (tests/models/gemma_tiny.py), HF's logits and greedy tokens of them committed in
tests/goldens/family_references.json (tests/goldens/make_family_references.py made them)."""

import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from tests.models import gemma_tiny
from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm.errors import UnsupportedModel
from vtllm.executor.cpu_ops import CpuOps, _round_to
from vtllm.kernels import QType
from vtllm.kernels import cpu as kernels
from vtllm.models import gemma_checkpoint, registry
from vtllm.models.gemma import layer_windows
from vtllm.models.loader import load_model
from vtllm.models.ops import GemmaOps, Ops
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors, to_bf16_bits

REFS = json.loads((Path(__file__).parents[1] / "goldens/family_references.json").read_text())


def write(directory: Path, name: str, config: dict | None = None, prefix: str = "model.") -> Path:
    arrays = gemma_tiny.tensors(name)
    arrays = {prefix + k.removeprefix("model."): v for k, v in arrays.items()}
    save_safetensors(directory / "model.safetensors", arrays)
    cfg = config or gemma_tiny.CONFIGS[name]
    (directory / "config.json").write_text(json.dumps(cfg))
    vocab = gemma_tiny.CONFIGS[name]["vocab_size"]
    (directory / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(vocab)))
    return directory


@pytest.fixture(scope="module", params=sorted(gemma_tiny.CONFIGS))
def model(request, tmp_path_factory):
    name = request.param
    ref = REFS["models"][name]
    assert gemma_tiny.digest(gemma_tiny.tensors(name)) == ref["weights_sha256"]
    loaded = load_model(write(tmp_path_factory.mktemp(name), name))
    return name, ref, make_runner(loaded, num_blocks=40, max_model_len=96)


def test_logits_match_hf(model):
    _, ref, runner = model
    ids = ref["prompt_ids"] + ref["output_ids"]
    ours = teacher_forced_logits(runner, ids, [len(ids)])
    top, want = np.array(ref["top_ids"]), np.array(ref["top_logits"], np.float32)
    got = np.take_along_axis(ours, top, axis=1)
    scale = np.abs(want).max(axis=1, keepdims=True)
    assert np.max(np.abs(got - want) / scale) < 1e-5  # measured: 1e-6
    clear = np.array(ref["margins"]) > 1e-2
    assert clear.mean() > 0.95
    assert np.array_equal(ours.argmax(1)[clear], top[clear, 0])


def test_greedy_matches_hf_and_chunks_are_invisible(model):
    _, ref, runner = model
    prompt, out = ref["prompt_ids"], ref["output_ids"]
    ids = prompt + out
    decode = teacher_forced_logits(runner, ids, [len(prompt)] + [1] * len(out))
    # greedy, one token a step: each step's argmax is HF's next token
    assert decode[len(prompt) - 1 : -1].argmax(1).tolist() == out
    whole = teacher_forced_logits(runner, ids, [len(ids)])
    chunked = teacher_forced_logits(runner, ids, [5, 11, 3, 17, 9, 27])
    assert np.array_equal(whole, decode)
    assert np.array_equal(whole, chunked)


def test_config_fields():
    for name, every in (("gemma2", 2), ("gemma3", 6)):
        raw = gemma_tiny.CONFIGS[name]
        fam = registry.family_for_hf(raw["architectures"])
        c = gemma_checkpoint.read_config(raw, fam, Path("config.json"))
        globals_ = [not s for s in c.sliding_layers]
        assert globals_ == [(i + 1) % every == 0 for i in range(c.num_layers)]
        assert layer_windows(c) == [0 if g else 8 for g in globals_]
    g3 = gemma_checkpoint.read_config(gemma_tiny.CONFIGS["gemma3"], fam, Path("c"))
    assert (g3.rope_theta, g3.rope_local_theta) == (1e6, 1e4)
    assert g3.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert (g3.attn_logit_softcap, g3.final_logit_softcap) == (0.0, 0.0)
    # transformers 5 saves rope per layer type and layer_types: the same config
    new = {k: v for k, v in gemma_tiny.CONFIGS["gemma3"].items() if not k.startswith("rope")}
    new["layer_types"] = [("full", "sliding")[s] + "_attention" for s in g3.sliding_layers]
    new["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    assert gemma_checkpoint.read_config(new, fam, Path("c")) == g3


def test_multimodal_checkpoint_loads_its_text_model(tmp_path):
    text = {k: v for k, v in gemma_tiny.CONFIGS["gemma3"].items() if k != "architectures"}
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "text_config": text}
    loaded = load_model(write(tmp_path, "gemma3", cfg, prefix="model.language_model."))
    arrays = gemma_tiny.tensors("gemma3")
    layer = loaded.weights.layers[2]
    assert np.array_equal(layer.o.data, arrays["model.layers.2.self_attn.o_proj.weight"])
    want = arrays["model.layers.2.post_feedforward_layernorm.weight"] + np.float32(1)
    assert np.array_equal(layer.post_ffn_norm, want)
    (tmp_path / "t").mkdir()
    alone = load_model(write(tmp_path / "t", "gemma3"))
    assert loaded.config == alone.config


def test_refusals_name_the_architecture():
    assert registry.family("gemma2").name == "gemma2"  # GGUF: tests/models/test_gguf_families
    with pytest.raises(UnsupportedModel, match="gemma4"):
        registry.family("gemma4")
    for name in ("gemma2", "gemma3", "llama"):
        registry.check_cuda(name)  # the CUDA backend has Gemma's ops too


def test_cpu_ops_implement_gemma_ops():  # CudaOps: tests/kernels_cuda/test_gemma_forward_sim
    for name in set(vars(GemmaOps)) - set(vars(Ops)):
        if not name.startswith("_") and callable(getattr(GemmaOps, name)):
            want = list(inspect.signature(getattr(GemmaOps, name)).parameters)
            assert list(inspect.signature(getattr(CpuOps, name)).parameters) == want, name


def test_gelu_tanh_and_soft_cap_kernels():
    rng = np.random.default_rng(0)
    x = (3 * rng.standard_normal((5, 2 * 37))).astype(np.float32)
    out = np.empty((5, 37), np.float32)
    kernels.gelu_tanh_and_mul(x, out)
    g, up = x[:, :37].astype(np.float64), x[:, 37:].astype(np.float64)
    ref = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * up
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-6)
    y = x.copy()
    kernels.soft_cap(y, 2.5)
    assert np.allclose(y, 2.5 * np.tanh(x.astype(np.float64) / 2.5), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window,cap", [(0, 1.5), (5, 0.0), (5, 2.0)])
def test_windowed_attention_kernel(window, cap):
    rng = np.random.default_rng(1)
    n, hq, hk, d, bs = 13, 4, 2, 20, 4
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    k = rng.standard_normal((n, hk, d)).astype(np.float32)
    v = rng.standard_normal((n, hk, d)).astype(np.float32)
    blocks = np.array([[3, 0, 5, 1]], np.int32)  # out of order on purpose
    k_cache = np.zeros((6, bs, hk, d), np.float32)
    v_cache = np.zeros_like(k_cache)
    slots = (blocks[0, np.arange(n) // bs] * bs + np.arange(n) % bs).astype(np.int32)
    kernels.write_kv(k, v, k_cache, v_cache, slots)
    out = np.empty_like(q)
    qsl, lens = np.array([0, n], np.int32), np.array([n], np.int32)
    kernels.paged_attention_window(q, k_cache, v_cache, blocks, lens, qsl, 0.3, window, cap, out)
    for t in range(n):
        lo = max(0, t - window + 1) if window else 0
        for h in range(hq):
            s = (k[lo : t + 1, h // 2].astype(np.float64) @ q[t, h]) * 0.3
            s = cap * np.tanh(s / cap) if cap else s
            p = np.exp(s - s.max())
            ref = p @ v[lo : t + 1, h // 2] / p.sum()
            assert np.allclose(out[t, h], ref, rtol=1e-4, atol=1e-5), (t, h)


def test_bf16_embedding_scale_rounds_as_hf():
    x = np.array([1.2345678, -3.3333333, 1e-3], np.float32)
    got = _round_to(x.copy(), QType.BF16)
    assert np.array_equal(got.view(np.uint32) >> 16, to_bf16_bits(x))
    assert np.array_equal(_round_to(x.copy(), QType.F16), x.astype(np.float16).astype(np.float32))
