"""Gemma 2, Gemma 3, Phi-3 and a windowed Mistral on the CUDA backend against HF transformers:
the tiny random checkpoints of tests/models (gemma_tiny, phi3_tiny) and HF's logits and greedy
tokens of them committed in tests/goldens (family_references.json, phi3_references.json), so
no torch is needed. Prompts of 40 tokens against windows of 8 to 12: most keys of a windowed
layer are out of its window.

Teacher-forced, as tests/models/test_gemma and test_phi3 run the CPU backend: a prompt step,
then one-token steps (Gemma 3's global layers: the decode kernels), logits within
float32 noise of HF's and the same bits as the whole sequence in one step; and greedy decoding
through the sampler with CUDA graphs gives HF's tokens.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.models import gemma_tiny, phi3_tiny
from tests.models.runner_util import teacher_forced_logits
from vtllm.models.loader import load_model
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu

GOLDENS = Path(__file__).parents[1] / "goldens"
REFS = {
    **json.loads((GOLDENS / "family_references.json").read_text())["models"],
    **json.loads((GOLDENS / "phi3_references.json").read_text())["models"],
}
TINY = {"gemma2": gemma_tiny, "gemma3": gemma_tiny, "phi3": phi3_tiny, "mistral": phi3_tiny}
TINY["qwen2window"] = phi3_tiny  # windowed from its second layer only
BLOCK = 4


def _write(directory: Path, name: str) -> Path:
    tiny = TINY[name]
    save_safetensors(directory / "model.safetensors", tiny.tensors(name))
    config = tiny.CONFIGS[name]
    (directory / "config.json").write_text(json.dumps(config))
    tokenizer = byte_tokenizer_json(config["vocab_size"])
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    return directory


def _runner(loaded, *, use_graphs=False, kv_cache_dtype="float32"):
    from vtllm.executor.cuda_runner import CudaModelRunner

    return CudaModelRunner(
        loaded,
        block_size=BLOCK,
        max_num_seqs=4,
        max_model_len=96,  # phi3: under original_max_position_embeddings (the short factors)
        max_num_batched_tokens=128,
        kv_cache_memory=64 << 20,
        kv_cache_fraction=0.0,
        use_graphs=use_graphs,
        kv_cache_dtype=kv_cache_dtype,
    )


@pytest.fixture(scope="module", params=sorted(TINY))
def model(request, tmp_path_factory):
    name = request.param
    ref = REFS[name]
    assert TINY[name].digest(TINY[name].tensors(name)) == ref["weights_sha256"]
    return name, ref, load_model(_write(tmp_path_factory.mktemp(name), name))


@pytest.mark.parametrize("kv", ["float32", "bfloat16"])
def test_teacher_forced_logits_match_hf(model, kv):
    """float32 cache: HF's float32 logits within float32 noise; bf16 cache (K and V rounded):
    within bf16 noise, argmax equal where HF's margin is clear of it."""
    _, ref, loaded = model
    runner = _runner(loaded, kv_cache_dtype=kv)
    prompt, out = ref["prompt_ids"], ref["output_ids"]
    ids = prompt + out
    decode = teacher_forced_logits(runner, ids, [len(prompt)] + [1] * len(out))
    whole = teacher_forced_logits(runner, ids, [len(ids)])
    np.testing.assert_array_equal(decode, whole)  # a row's bits never depend on its step
    top, want = np.array(ref["top_ids"]), np.array(ref["top_logits"], np.float32)
    got = np.take_along_axis(whole, top, axis=1)
    scale = np.abs(want).max(axis=1, keepdims=True)
    bound, margin = (1e-4, 1e-2) if kv == "float32" else (2e-2, 0.2)
    assert np.max(np.abs(got - want) / scale) < bound
    clear = np.array(ref["margins"]) > margin
    assert clear.mean() > 0.5
    assert np.array_equal(whole.argmax(1)[clear], top[clear, 0])


def test_greedy_with_graphs_gives_hfs_tokens(model):
    """The prompt step eager, then one-token steps replayed from CUDA graphs, each reading the
    token the sampler wrote into the device mirror."""
    _, ref, loaded = model
    runner = _runner(loaded, use_graphs=True)
    prompt, out = ref["prompt_ids"], ref["output_ids"]
    greedy = SamplingParams(temperature=0)
    blocks = list(range(1, 1 + -(-(len(prompt) + len(out)) // BLOCK)))
    seat = SeatedRequest(0, list(prompt), len(prompt), greedy, 0, blocks)
    plans = [StepPlan(0, [seat], [Chunk(0, 0, len(prompt), [], True)], [])]
    for i in range(len(out) - 1):
        plans.append(StepPlan(i + 1, [], [Chunk(0, len(prompt) + i, 1, [], True)], []))
    tokens = [runner.execute(plan).sampled[0].token_id for plan in plans]
    assert tokens == out
    assert runner.graphs, "the one-token steps replay from a captured graph"
