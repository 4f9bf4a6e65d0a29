"""Qwen3-MoE and Mixtral on the CUDA backend against HF transformers: the tiny random
checkpoints of tests/models/moe_tiny and HF's logits and greedy tokens of them committed in
tests/goldens/moe_references.json (no torch needed). The checkpoints are float32: every linear
takes the GEMV kernels, the experts the expert-indexed GEMV.

Teacher-forced: a prompt step, then one-token steps, logits within float32 noise of HF's and
the same bits as the whole sequence in one step (the routed experts are batch-invariant);
a prompt beside another keeps its bits; greedy decoding through the sampler with CUDA graphs
gives HF's tokens (the routing never leaves the device, so the decode graph captures it).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.models import moe_tiny
from tests.models.runner_util import teacher_forced_logits
from vtllm.models.loader import load_model
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu

REFS = json.loads((Path(__file__).parents[1] / "goldens/moe_references.json").read_text())
BLOCK = 4


def _write(directory: Path, name: str) -> Path:
    save_safetensors(directory / "model.safetensors", moe_tiny.tensors(name))
    config = moe_tiny.CONFIGS[name]
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(config["vocab_size"])))
    return directory


def _runner(loaded, *, use_graphs=False):
    from vtllm.executor.cuda_runner import CudaModelRunner

    return CudaModelRunner(
        loaded,
        block_size=BLOCK,
        max_num_seqs=4,
        max_model_len=96,
        max_num_batched_tokens=128,
        kv_cache_memory=64 << 20,
        kv_cache_fraction=0.0,
        use_graphs=use_graphs,
    )


@pytest.fixture(scope="module", params=sorted(moe_tiny.CONFIGS))
def model(request, tmp_path_factory):
    name = request.param
    ref = REFS["models"][name]
    assert moe_tiny.digest(moe_tiny.tensors(name)) == ref["weights_sha256"]
    return name, ref, load_model(_write(tmp_path_factory.mktemp(name), name))


def test_teacher_forced_logits_match_hf(model):
    _, ref, loaded = model
    runner = _runner(loaded)
    prompt, out = ref["prompt_ids"], ref["output_ids"]
    ids = prompt + out
    decode = teacher_forced_logits(runner, ids, [len(prompt)] + [1] * len(out))
    whole = teacher_forced_logits(runner, ids, [len(ids)])
    np.testing.assert_array_equal(decode, whole)  # a row's bits never depend on its step
    chunked = teacher_forced_logits(runner, ids, [5, 11, 3, 17, 9, 27])
    np.testing.assert_array_equal(chunked, whole)
    top, want = np.array(ref["top_ids"]), np.array(ref["top_logits"], np.float32)
    got = np.take_along_axis(whole, top, axis=1)
    scale = np.abs(want).max(axis=1, keepdims=True)
    assert np.max(np.abs(got - want) / scale) < 1e-4
    clear = np.array(ref["margins"]) > 1e-2
    assert clear.mean() > 0.9
    assert np.array_equal(whole.argmax(1)[clear], top[clear, 0])


def test_a_prompt_keeps_its_bits_beside_another(model):
    name, ref, loaded = model
    runner = _runner(loaded)
    a = ref["prompt_ids"]
    b = np.random.default_rng(3).integers(3, moe_tiny.CONFIGS[name]["vocab_size"], 37).tolist()
    greedy = SamplingParams(temperature=0)

    def step(step_id, seqs):
        seats, chunks = [], []
        for slot, ids in seqs:
            blocks = [1 + 32 * slot + i for i in range(-(-len(ids) // BLOCK))]
            seats.append(SeatedRequest(slot, ids, len(ids), greedy, 0, blocks))
            chunks.append(Chunk(slot, 0, len(ids), [], sample=False, prompt_logprobs=True))
        logits, *_ = runner.compute_logits(StepPlan(step_id, seats, chunks, []))
        return np.array(logits, np.float32, copy=True)

    alone = step(0, [(0, a)])
    beside = step(1, [(1, b), (2, a)])
    np.testing.assert_array_equal(alone, beside[len(b) :])


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
