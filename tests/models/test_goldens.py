"""The default model against HF transformers float32 (goldens made by make_goldens.py)."""

import numpy as np
import pytest

from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=512, kv_cache_memory=64 << 20)


def test_greedy_64_tokens_token_exact(llm, goldens):
    prompts = [p["prompt_ids"] for p in goldens["prompts"]]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    mismatches = []
    for prompt, out in zip(goldens["prompts"], outputs, strict=True):
        if out.outputs[0].token_ids != prompt["output_ids"]:
            mismatches.append(prompt["name"])
    assert not mismatches, f"not token-exact: {mismatches}"


def test_teacher_forced_logits_within_1e4(default_model, goldens):
    runner = make_runner(default_model, num_blocks=64, block_size=16, max_model_len=256)
    worst = 0.0
    for prompt in goldens["prompts"]:
        ids = prompt["prompt_ids"] + prompt["output_ids"]
        logits = teacher_forced_logits(runner, ids, [len(ids)])[: len(ids) - 1]
        ref_ids = np.asarray(prompt["top5_ids"])[: len(ids) - 1]
        ref = np.asarray(prompt["top5_logits"], np.float64)[: len(ids) - 1]
        ours = np.take_along_axis(logits, ref_ids, axis=1)
        rel = np.abs(ours - ref) / np.abs(ref).max(axis=1, keepdims=True)
        worst = max(worst, float(rel.max()))
        assert (logits.argmax(1) == ref_ids[:, 0]).all(), prompt["name"]
    assert worst < 1e-4, worst
