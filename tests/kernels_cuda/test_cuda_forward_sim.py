"""The CUDA runner end to end on tiny random models, under numba's simulator (or a GPU): a
prompt step of two sequences, a batched decode step, a one-token decode step (the folded and
rope-in-attention paths) and a sampled step, through the runner's public contract.

Two guards: under the simulator, the logits' bits equal those recorded in
goldens/cuda_forward_sim.npz (so a refactor of the forward or the runner changes no bit on this
path); anywhere, they agree with the CPU runner's within float tolerance (the same weights,
float32 math in another order).
Regenerate the golden only for an intended change of numerics:
    VT_WRITE_GOLDENS=1 NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -q -m cudasim \\
        tests/kernels_cuda/test_cuda_forward_sim.py
"""

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from tests.kernels_cuda.helpers import SIMULATOR
from tests.models.runner_util import make_runner
from vtllm.models.loader import load_model
from vtllm.models.synthetic import write_checkpoint
from vtllm.scheduler.plan import Chunk, SeatedRequest, StepPlan
from vtllm.scheduler.sampling_params import SamplingParams

pytestmark = pytest.mark.cudasim

GOLDEN = Path(__file__).parent / "goldens" / "cuda_forward_sim.npz"
BLOCK = 4
# name: (synthetic shape, bf16 weights, layers). bf16 with 16-aligned shapes takes the
# tensor-core linears (packed weights, norms folded into one-token steps, rope inside attention
# where the head is a whole warp); float32 takes the GEMV linears, qkv_rope and paged
# attention. One layer each (the residual between bf16 layers is in play in
# test_gemma_forward_sim's two-layer model; here a second layer doubled a 10-minute case); a
# vocabulary of 128 (the tokenizer is not used) keeps the head and the sampler cheap: the
# simulator runs every CUDA thread as a Python thread.
MODELS = {"qwen3-bf16": ("tiny-qwen3-d32", True, 1)}
if not SIMULATOR:  # ~200 s under the simulator; its kernels have simulator cases of their own
    MODELS["llama-f32"] = ("tiny", False, 1)
VOCAB = 128
PROMPTS = (6, 4)  # two sequences' prompt lengths: 10 tokens, over one mma group of 8
FORCED = 3  # tokens teacher-forced after each prompt


def _ids(vocab: int) -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [rng.integers(3, vocab, n + FORCED).tolist() for n in PROMPTS]


def _blocks(seq: int, n: int) -> list[int]:
    return [1 + 16 * seq + i for i in range(-(-n // BLOCK))]


def _plans(vocab: int) -> list[StepPlan]:
    """Prompt step (both, every row's logits), decode of both, decode of sequence 0 alone,
    decode of both: every step's tokens are known (teacher-forced), so each runner sees the
    same inputs whatever it would have sampled."""
    ids = _ids(vocab)
    greedy = SamplingParams(temperature=0)
    seats = [
        SeatedRequest(s, ids[s], PROMPTS[s], greedy, 0, _blocks(s, len(ids[s]))) for s in range(2)
    ]
    prompt = [Chunk(s, 0, PROMPTS[s], [], sample=True, prompt_logprobs=True) for s in range(2)]
    decode = [
        [Chunk(0, PROMPTS[0], 1, [], True), Chunk(1, PROMPTS[1], 1, [], True)],
        [Chunk(0, PROMPTS[0] + 1, 1, [], True)],
        [Chunk(0, PROMPTS[0] + 2, 1, [], True), Chunk(1, PROMPTS[1] + 1, 1, [], True)],
    ]
    plans = [StepPlan(0, seats, prompt, [])]
    plans += [StepPlan(i + 1, [], chunks, []) for i, chunks in enumerate(decode)]
    return plans


def _cuda_runner(loaded, **kw):
    from vtllm.executor.cuda_runner import CudaModelRunner

    return CudaModelRunner(
        loaded,
        block_size=BLOCK,
        max_num_seqs=4,
        max_model_len=64,
        max_num_batched_tokens=32,
        kv_cache_memory=1 << 20,
        kv_cache_fraction=0.0,
        use_graphs=False,  # capture needs the driver API, which the simulator lacks
        **kw,
    )


@pytest.fixture(scope="module", params=list(MODELS))
def model(request, tmp_path_factory):
    shape, bf16, layers = MODELS[request.param]
    out = tmp_path_factory.mktemp(request.param)
    path = write_checkpoint(out, shape, seed=9, bf16=bf16, layers=layers, vocab=VOCAB)
    return request.param, load_model(path)


def _logits(runner, plans) -> list[np.ndarray]:
    out = []
    for plan in plans:
        logits, *_ = runner.compute_logits(plan)
        out.append(np.array(logits, np.float32, copy=True))
    return out


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, np.float32).tobytes()).hexdigest()


def _golden() -> dict:
    if not GOLDEN.exists():
        return {}
    with np.load(GOLDEN) as f:
        return {k: f[k] for k in f.files}


def _write_golden(name: str, steps: list[np.ndarray], tokens: np.ndarray) -> None:
    data = _golden()
    for i, a in enumerate(steps):
        data[f"{name}/step{i}/sha256"] = np.array(_digest(a))
        data[f"{name}/step{i}/head"] = a[:, :8].copy()  # a readable slice for a failing diff
    data[f"{name}/sampled"] = tokens
    np.savez_compressed(GOLDEN, **data)


def _sampled(runner) -> np.ndarray:
    """Greedy tokens of a step of two one-token prompts and a decode step through launch /
    finish (sampler, device token mirror): the decode reads the ids the sampler wrote."""
    greedy = SamplingParams(temperature=0)
    seats = [SeatedRequest(s, [5 + s], 1, greedy, 0, _blocks(s, 8)) for s in (2, 3)]
    plans = [StepPlan(10, seats, [Chunk(s, 0, 1, [], True) for s in (2, 3)], [])]
    plans.append(StepPlan(11, [], [Chunk(s, 1, 1, [], True) for s in (2, 3)], []))
    out = []
    for plan in plans:
        result = runner.execute(plan)
        out.append([t.token_id for t in result.sampled])
    return np.asarray(out, np.int32)


def test_cuda_forward_bits_and_cpu_agreement(model):
    name, loaded = model
    vocab = loaded.config.vocab_size
    plans = _plans(vocab)
    runner = _cuda_runner(loaded)
    gpu = _logits(runner, plans)
    tokens = _sampled(runner)
    cpu = _logits(make_runner(loaded, max_model_len=64), plans)
    for g, c in zip(gpu, cpu, strict=True):
        assert g.shape == c.shape
        scale = np.abs(c).max(axis=1, keepdims=True)
        assert np.max(np.abs(g - c) / scale) < 1e-3
        top2 = np.sort(c, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 1e-3 * scale[:, 0]
        assert (g.argmax(1) == c.argmax(1))[clear].all()
    if not SIMULATOR:  # the golden holds the simulator's bits; a card rounds in its own way
        return
    if os.environ.get("VT_WRITE_GOLDENS") == "1":
        _write_golden(name, gpu, tokens)
    golden = _golden()
    assert f"{name}/sampled" in golden, f"no golden for {name}: see the module docstring"
    for i, a in enumerate(gpu):
        head = golden[f"{name}/step{i}/head"]
        np.testing.assert_array_equal(a[:, :8], head, err_msg=f"{name} step {i}")
        assert _digest(a) == str(golden[f"{name}/step{i}/sha256"]), f"{name} step {i}"
    np.testing.assert_array_equal(tokens, golden[f"{name}/sampled"])
