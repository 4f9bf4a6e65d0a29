"""The CUDA runner on tiny Qwen3-MoE and Mixtral models (tests/models/moe_tiny's configs, cut
for the simulator) against the CPU runner, and a prompt's bits alone and beside another
prompt (batch invariance of the routed experts).

Qwen3-MoE runs in bf16 with 16-aligned shapes: its attention and dense-layer linears take the
tensor cores and one-token steps fold the norms (the routed layer then runs the ffn norm
itself and adds its experts into the residual stream). Mixtral runs in float32 (the GEMV
linears). One routed layer each: the tensor-core linears cost the simulator most of the time.
"""

import inspect
import json

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR
from tests.kernels_cuda.test_cuda_forward_sim import _blocks, _cuda_runner, _logits
from tests.models import moe_tiny
from tests.models.runner_util import make_runner
from vtllm.models.loader import load_model
from vtllm.models.ops import MoeOps, Ops
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams

pytestmark = pytest.mark.cudasim

VOCAB = 128
# name: (moe_tiny config, bf16, layers, expert width). The simulator runs every CUDA thread as
# a Python thread and the expert GEMV launches a block row per (token, rank) pair: narrow
# experts, few tokens.
MODELS = {"qwen3_moe-bf16": ("qwen3_moe", True, 1, 16)}
if not SIMULATOR:  # ~100 s under the simulator; the GEMV experts' kernels have cases of their own
    MODELS["mixtral-f32"] = ("mixtral", False, 1, 16)
GREEDY = SamplingParams(temperature=0)


def _write(directory, name: str, bf16: bool, layers: int, width: int):
    config = dict(moe_tiny.CONFIGS[name], vocab_size=VOCAB, num_hidden_layers=layers)
    config["moe_intermediate_size" if name == "qwen3_moe" else "intermediate_size"] = width
    rng = np.random.default_rng(moe_tiny.SEED)
    arrays = {}
    for tensor, shape, law in moe_tiny.tensor_specs(config):
        x = rng.standard_normal(shape)
        x = 1.0 + 0.1 * x if law == "norm" else 0.3 * x if law == "embed" else x / np.sqrt(shape[1])
        arrays[tensor] = x.astype(np.float32)
    save_safetensors(directory / "model.safetensors", arrays, bf16=bf16)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(VOCAB)))
    return load_model(directory)


def _prompt_step(step: int, seqs: list[tuple[int, list[int]]]) -> StepPlan:
    seats = [
        SeatedRequest(s, ids, len(ids) - 1, GREEDY, 0, _blocks(s, len(ids))) for s, ids in seqs
    ]
    chunks = [Chunk(s, 0, len(ids) - 1, [], sample=True, prompt_logprobs=True) for s, ids in seqs]
    return StepPlan(step, seats, chunks, [])


@pytest.mark.parametrize("name", list(MODELS))
def test_moe_forward_agrees_with_cpu_and_is_batch_invariant(tmp_path, name):
    """A prompt step and a one-token decode step (teacher-forced) against the CPU runner;
    then the same prompt again in other slots, after another prompt in the same step: its
    rows sit elsewhere and its experts see other tokens, its logits keep their bits."""
    model = _write(tmp_path, *MODELS[name])
    rng = np.random.default_rng(8)
    a, b = rng.integers(3, VOCAB, 4).tolist(), rng.integers(3, VOCAB, 3).tolist()
    decode = StepPlan(1, [], [Chunk(0, len(a) - 1, 1, [], True)], [])
    plans = [_prompt_step(0, [(0, a)]), decode]
    runner = _cuda_runner(model)
    gpu = _logits(runner, plans)
    cpu = _logits(make_runner(model, max_model_len=64), plans)
    for g, c in zip(gpu, cpu, strict=True):
        assert g.shape == c.shape
        scale = np.abs(c).max(axis=1, keepdims=True)
        assert np.max(np.abs(g - c) / scale) < 1e-3
        top2 = np.sort(c, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 1e-3 * scale[:, 0]
        assert (g.argmax(1) == c.argmax(1))[clear].all()
    (beside,) = _logits(runner, [_prompt_step(2, [(2, b), (3, a)])])
    assert np.array_equal(gpu[0], beside[len(b) - 1 :])


def test_cuda_ops_implement_moe_ops():
    from vtllm.executor.cuda_ops import CudaOps

    for name in set(vars(MoeOps)) - set(vars(Ops)):
        if not name.startswith("_") and callable(getattr(MoeOps, name)):
            want = list(inspect.signature(getattr(MoeOps, name)).parameters)
            assert list(inspect.signature(getattr(CudaOps, name)).parameters) == want, name
