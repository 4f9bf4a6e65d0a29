"""The CUDA runner end to end on tiny Gemma 2, Gemma 3 and Phi-3 checkpoints under numba's
simulator (or a GPU), against the CPU runner. The configs are tests/models' (gemma_tiny,
phi3_tiny) shrunk, their weights drawn with those modules' laws: two layers (one, Phi-3), two
query heads of 16 over one kv head, hidden and MLP widths of 32, a vocabulary of 64 and a
window of 4, so that the simulator runs them in about a minute. Sequences of 8 tokens, past the
window, are teacher-forced through a prompt chunk and one-token steps. Gemma 2 soft-caps every
layer's scores and the logits, in bf16 (the packed tensor-core linears, the GeGLU over their
interleaved gate/up rows, the embedding scaled and rounded in bf16); Gemma 3 has q/k norm and
a global layer beside the windowed one (the split and prefill kernels there); Phi-3
windows every layer of the Llama forward.

Two guards: the logits agree with the CPU runner's within float tolerance (argmax equal where
the margin is clear), and a row's bits are the same whether its token came in the whole
sequence at once or chunk by chunk (batch invariance on the GPU).
"""

import inspect
import json
from unittest import mock

import numpy as np
import pytest

from tests.models import gemma_tiny, phi3_tiny
from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm.models.loader import load_model
from vtllm.models.ops import GemmaOps, Ops
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors

pytestmark = pytest.mark.cudasim

VOCAB = 64
SHRINK = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 2,
    "sliding_window": 4,
}
TOKENS = 8  # past the window
CHUNKS = [6, 1, 1]
# name: (module of tiny checkpoints, its config name, bf16 weights, config changes)
MODELS = {
    "gemma2-bf16": (gemma_tiny, "gemma2", True, {}),  # layers: local, global
    "gemma3": (gemma_tiny, "gemma3", False, {"sliding_window_pattern": 2}),  # local, global
    "phi3": (phi3_tiny, "phi3", False, {"num_hidden_layers": 1}),
}


def _write(directory, tiny, name: str, bf16: bool, changes: dict):
    """The module's checkpoint `name` at the shrunk shapes (the module docstring)."""
    config = {**tiny.CONFIGS[name], **SHRINK, **changes}
    with mock.patch.dict(tiny.CONFIGS, {name: config}):
        arrays = tiny.tensors(name)  # drawn with the module's laws at the config's shapes
    save_safetensors(directory / "model.safetensors", arrays, bf16=bf16)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(VOCAB)))
    return directory


def _cuda_runner(loaded):
    from vtllm.executor.cuda_runner import CudaModelRunner

    return CudaModelRunner(
        loaded,
        block_size=4,
        max_num_seqs=2,
        max_model_len=32,
        max_num_batched_tokens=TOKENS,
        kv_cache_memory=1 << 20,
        kv_cache_fraction=0.0,
        use_graphs=False,  # capture needs the driver API, which the simulator lacks
    )


@pytest.mark.parametrize("name", list(MODELS))
def test_cuda_runner_matches_the_cpu_runner(name, tmp_path):
    tiny, config_name, bf16, changes = MODELS[name]
    loaded = load_model(_write(tmp_path, tiny, config_name, bf16, changes))
    ids = np.random.default_rng(3).integers(3, VOCAB, TOKENS).tolist()
    runner = _cuda_runner(loaded)
    whole = teacher_forced_logits(runner, ids, [TOKENS])
    chunked = teacher_forced_logits(runner, ids, CHUNKS)
    np.testing.assert_array_equal(chunked, whole)
    cpu = teacher_forced_logits(make_runner(loaded, max_model_len=32), ids, [TOKENS])
    scale = np.abs(cpu).max(axis=1, keepdims=True)
    assert np.max(np.abs(whole - cpu) / scale) < 1e-4
    top2 = np.sort(cpu, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-3 * scale[:, 0]
    assert clear.mean() > 0.8
    assert (whole.argmax(1) == cpu.argmax(1))[clear].all()


def test_cuda_ops_implement_gemma_ops():
    from vtllm.executor.cuda_ops import CudaOps

    for name in set(vars(GemmaOps)) - set(vars(Ops)):
        if not name.startswith("_") and callable(getattr(GemmaOps, name)):
            want = list(inspect.signature(getattr(GemmaOps, name)).parameters)
            assert list(inspect.signature(getattr(CudaOps, name)).parameters) == want, name
