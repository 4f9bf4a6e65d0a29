"""The CUDA backend end to end: the depth-2 law on the GPU, graphs on and off, and agreement
with the CPU backend on checkpoints whose greedy paths are stable (peaked logits)."""

import anyio
import numpy as np
import pytest

from tests.engine.test_depth2_law import _assert_same, _serve, _workload
from tests.models.runner_util import teacher_forced_logits
from vtllm.config import resolve
from vtllm.engine.build import build_parts
from vtllm.engine.loop import StepLoop
from vtllm.models.loader import load_model
from vtllm.models.synthetic import write_checkpoint
from vtllm.scheduler.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(write_checkpoint(tmp_path_factory.mktemp("law"), "tiny", seed=7))


def _run(
    loaded,
    work,
    *,
    device: str,
    depth: int,
    graphs: bool = True,
    kv: str = "float32",
    pdl: bool = True,
    matmul: str = "float32",
    split_rows: int = 0,
    flash: bool = False,
    gemm: str = "mma",
):
    """kv: the KV cache dtype; the budget holds the same number of blocks at either width.
    pdl: the graphs' kernel edges programmatic (VT_CUDA_PDL). matmul: the matmul input dtype
    (float32 here, the cuda default being bfloat16, so the CPU comparisons hold to float32).
    split_rows: VT_CUDA_SPLIT_ATTENTION_ROWS. flash: VT_CUDA_FLASH_PREFILL. gemm:
    VT_CUDA_PREFILL_GEMM."""
    half = kv == "bfloat16"
    config, _ = resolve(
        device=device,
        cuda_graphs=graphs,
        cuda_pdl=pdl,
        cuda_split_attention_rows=split_rows,
        cuda_flash_prefill=flash,
        cuda_prefill_gemm=gemm,
        async_depth=depth,
        kv_cache_dtype=kv,
        matmul_input_dtype=matmul,
        kv_cache_memory=30 * 2048 // (2 if half else 1),  # as in the CPU law: forces preemptions
        block_size=4,
        max_num_seqs=16,
        max_num_batched_tokens=64,
        max_model_len=128,
    )
    _, scheduler, backend, _ = build_parts(config, loaded)
    try:
        if device == "cuda":  # the rows that take the decode kernels: by default every
            # row of these steps (max_num_batched_tokens), else split_rows
            assert backend.runner.ops.attn_scratch[0].shape[0] == (split_rows or 64)
        loop = StepLoop(
            scheduler,
            backend,
            loaded.tokenizer,
            async_depth=depth,
            vocab_size=loaded.config.vocab_size,
        )
        results = anyio.run(_serve, loop, work)
        scheduler.check_invariants()
        assert scheduler.num_used_blocks == 0 and not scheduler.requests
    finally:
        backend.close()
    return results, scheduler.num_preemptions


@pytest.fixture(scope="module")
def workload(tiny):
    return _workload(tiny.config.vocab_size, seed=11)


@pytest.fixture(scope="module")
def gpu_sync(tiny, workload):
    return _run(tiny, workload, device="cuda", depth=1, graphs=False)


@pytest.mark.parametrize(("graphs", "pdl"), [(False, False), (True, False), (True, True)])
def test_depth2_equals_depth1_on_gpu(tiny, workload, gpu_sync, graphs, pdl):
    sync, preempt1 = gpu_sync
    overlapped, preempt2 = _run(tiny, workload, device="cuda", depth=2, graphs=graphs, pdl=pdl)
    assert preempt1 + preempt2 > 0, "the KV budget should force preemptions"
    _assert_same(workload, sync, overlapped)


def test_split_attention_rows_leave_the_tokens_unchanged(tiny, workload, gpu_sync):
    """Steps of up to 64 tokens: by default every row takes the decode kernels; with a
    16-row scratch (max_num_seqs) rows past 16 go to the prefill kernel. Same bits either way,
    so the same tokens (the same schedule: both synchronous)."""
    sync, _ = gpu_sync
    narrow, _ = _run(tiny, workload, device="cuda", depth=1, graphs=False, split_rows=16)
    _assert_same(workload, sync, narrow)


def test_flash_prefill_in_graphs_gives_the_eager_tokens(tiny, workload, monkeypatch):
    """Prompt rows past 16 attend on tensor cores (other bits than the decode kernels', so
    not compared with the runs above); replayed in graphs, the same tokens as eager steps (the
    same schedule: both synchronous)."""
    from vtllm.kernels.cuda import _attention_flash as attention_flash

    launched, launch = [], attention_flash.flash_prefill
    monkeypatch.setattr(
        attention_flash, "flash_prefill", lambda *a, **k: (launched.append(1), launch(*a, **k))
    )
    kw = {"device": "cuda", "depth": 1, "kv": "bfloat16", "split_rows": 16, "flash": True}
    eager, _ = _run(tiny, workload, graphs=False, **kw)
    assert launched
    replayed, _ = _run(tiny, workload, graphs=True, **kw)
    _assert_same(workload, eager, replayed)


def test_flash_prefill_needs_a_bf16_cache(tiny, workload):
    from vtllm.errors import InvalidParameter

    with pytest.raises(InvalidParameter, match="cuda_flash_prefill needs kv_cache_dtype bfloat16"):
        _run(tiny, workload, device="cuda", depth=1, kv="float32", flash=True)


def test_wgmma_needs_bf16_matmul_inputs(tiny, workload):
    from vtllm.errors import InvalidParameter

    with pytest.raises(InvalidParameter, match="cuda_prefill_gemm wgmma needs"):
        _run(tiny, workload, device="cuda", depth=1, matmul="float32", gemm="wgmma")


def test_depth2_equals_depth1_with_bf16_kv(tiny, workload):
    """The law with a bfloat16 KV cache: rounding on write is deterministic, so the overlapped
    run with graphs still reproduces the synchronous eager one, preemptions included."""
    sync, preempt1 = _run(tiny, workload, device="cuda", depth=1, graphs=False, kv="bfloat16")
    overlapped, preempt2 = _run(tiny, workload, device="cuda", depth=2, kv="bfloat16")
    assert preempt1 + preempt2 > 0, "the KV budget should force preemptions"
    _assert_same(workload, sync, overlapped)


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen3", "tiny-qwen2"])
def test_greedy_matches_cpu_on_peaked_checkpoints(tmp_path, shape):
    loaded = load_model(write_checkpoint(tmp_path / shape, shape, seed=3, peaked=True, bf16=True))
    rng = np.random.default_rng(0)
    work = []
    for i in range(12):
        prompt = rng.integers(3, loaded.config.vocab_size, int(rng.integers(1, 40))).tolist()
        work.append(
            (f"g{i}", prompt, SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True), None)
        )
    cpu, _ = _run(loaded, work, device="cpu", depth=1)
    gpu, _ = _run(loaded, work, device="cuda", depth=2)
    _assert_same(work, cpu, gpu)


def _gpu_vs_cpu(loaded, ids):
    from tests.models.runner_util import make_runner
    from vtllm.executor.cuda_runner import CudaModelRunner

    cpu = teacher_forced_logits(make_runner(loaded), ids, [len(ids)])
    runner = CudaModelRunner(
        loaded,
        block_size=4,
        max_num_seqs=4,
        max_model_len=256,
        max_num_batched_tokens=256,
        kv_cache_memory=64 << 20,
        kv_cache_fraction=0.0,
        use_graphs=False,
    )
    gpu = teacher_forced_logits(runner, ids, [5, len(ids) - 5])
    scale = np.abs(cpu).max(axis=1, keepdims=True)
    rel = np.abs(gpu - cpu).max(axis=1, keepdims=True) / scale
    print(f"max relative logit difference {rel.max():.2e}")
    assert rel.max() < 1e-3
    top2 = np.sort(cpu, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-3 * scale[:, 0]
    assert (gpu.argmax(1) == cpu.argmax(1))[clear].all()


@pytest.mark.parametrize("qtype", ["F16", "Q4_0", "Q4_1", "Q8_0"])
def test_teacher_forced_gguf_gpu_vs_cpu(tmp_path, qtype):
    """GGUF weights (tied embedding, quantized linears) on the GPU against the CPU backend,
    teacher-forced: the same weights and float32 math in another summation order."""
    from tests.models.test_gguf_loader import write_tiny_gguf
    from vtllm.kernels import QType

    path, _ = write_tiny_gguf(tmp_path, QType[qtype])
    loaded = load_model(path)
    ids = np.random.default_rng(1).integers(3, loaded.config.vocab_size, 40).tolist()
    _gpu_vs_cpu(loaded, ids)


def test_teacher_forced_default_model_gpu_vs_cpu():
    from vtllm.errors import ModelLoadError

    try:
        loaded = load_model()
    except ModelLoadError as e:
        pytest.skip(f"default model not installed here: {e}")
    ids = loaded.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    _gpu_vs_cpu(loaded, ids)


def test_logprobs_and_prompt_logprobs_match_cpu(tmp_path):
    """Sampled-token logprobs (from the device sampler) and prompt logprobs on the GPU against
    the CPU backend on a peaked checkpoint: same ids, values within float32 noise. A prompt
    token's rank deep in the vocabulary sits among many near-equal logits, where the GPU's
    tensor-core sums (x carried as two bf16, ~2^-16 relative) may order a neighbour first:
    those ranks may differ by a few places, never the values."""
    from vtllm.llm import LLM

    directory = write_checkpoint(tmp_path / "m", "tiny-qwen3", seed=6, peaked=True, bf16=True)
    params = SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=3, prompt_logprobs=2
    )
    prompt = list(range(10, 30))
    outs = {}
    for device in ("cpu", "cuda"):
        llm = LLM(
            str(directory),
            device=device,
            kv_cache_memory=1 << 22,
            max_model_len=128,
            kv_cache_dtype="float32",
            matmul_input_dtype="float32",
        )
        try:
            outs[device] = llm.generate([prompt], params)[0]
        finally:
            llm.close()
    cpu, gpu = outs["cpu"], outs["cuda"]
    assert cpu.outputs[0].token_ids == gpu.outputs[0].token_ids
    pairs = list(zip(cpu.outputs[0].logprobs, gpu.outputs[0].logprobs, strict=True))
    pairs += [(a, b) for a, b in zip(cpu.prompt_logprobs, gpu.prompt_logprobs, strict=True) if a]
    assert len(pairs) == 12 + len(prompt) - 1
    for a, b in pairs:
        assert (a.token_id, a.top_ids) == (b.token_id, b.top_ids)
        assert a.rank == b.rank or (min(a.rank, b.rank) > 10 and abs(a.rank - b.rank) <= 3)
        np.testing.assert_allclose(b.logprob, a.logprob, atol=1e-3)
        np.testing.assert_allclose(b.top_logprobs, a.top_logprobs, atol=1e-3)


@pytest.mark.parametrize("shape", ["tiny-qwen3", "tiny-qwen2", "tiny-qwen3-d32"])
def test_folded_norms_give_the_bits_of_the_unfolded_step(tmp_path, monkeypatch, shape):
    """Steps of up to FOLD_TOKENS tokens fold the norms into the linears and the residual adds
    into their epilogues (executor/cuda_ops), and steps of up to ROPE_TOKENS make q and the new
    keys inside attention (kernels/cuda/attention); the same steps with nothing folded give the
    same logits, bit for bit (qwen2: a qkv bias; qwen3: q/k norms; d32: heads that
    rope_attention takes)."""
    from tests.models.runner_util import make_runner
    from vtllm.executor import cuda_ops
    from vtllm.executor.cuda_runner import CudaModelRunner
    from vtllm.kernels.cuda import attention

    loaded = load_model(write_checkpoint(tmp_path / shape, shape, seed=5, bf16=True))
    ids = np.random.default_rng(4).integers(3, loaded.config.vocab_size, 50).tolist()
    chunks = [30, 1, 1, cuda_ops.FOLD_TOKENS, 20 - 2 - cuda_ops.FOLD_TOKENS]

    def logits():
        runner = CudaModelRunner(
            loaded,
            block_size=4,
            max_num_seqs=4,
            max_model_len=256,
            max_num_batched_tokens=256,
            kv_cache_memory=64 << 20,
            kv_cache_fraction=0.0,
            use_graphs=False,
        )
        assert runner.ops.foldable
        c = loaded.config
        assert attention.fuses_rope(c.num_heads, c.num_kv_heads, c.head_dim) == (c.head_dim == 32)
        return teacher_forced_logits(runner, ids, chunks)

    folded = logits()
    monkeypatch.setattr(cuda_ops, "FOLD_TOKENS", 0)
    monkeypatch.setattr(attention, "ROPE_TOKENS", 0)
    unfolded = logits()
    np.testing.assert_array_equal(folded, unfolded)
    cpu = teacher_forced_logits(make_runner(loaded), ids, chunks)
    assert np.abs(folded - cpu).max() < 1e-3 * np.abs(cpu).max()


def test_auto_dtypes_run_bf16_on_cuda(tmp_path):
    """The cuda defaults (auto) are the bf16 KV cache and bf16 matmul inputs: the same logprobs,
    bit for bit, as asking for them, and not those of the float32 configuration."""
    from vtllm.llm import LLM

    directory = write_checkpoint(tmp_path / "m", "tiny-qwen3", seed=6, peaked=True, bf16=True)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=3)
    prompt = list(range(10, 40))
    outs = {}
    for name, dtypes in (
        ("auto", {}),
        ("bf16", {"kv_cache_dtype": "bfloat16", "matmul_input_dtype": "bfloat16"}),
        ("f32", {"kv_cache_dtype": "float32", "matmul_input_dtype": "float32"}),
    ):
        llm = LLM(
            str(directory), device="cuda", kv_cache_memory=1 << 22, max_model_len=128, **dtypes
        )
        try:
            out = llm.generate([prompt], params)[0].outputs[0]
        finally:
            llm.close()
        outs[name] = (out.token_ids, [(lp.logprob, *lp.top_logprobs) for lp in out.logprobs])
    assert outs["auto"] == outs["bf16"]
    assert outs["auto"][1] != outs["f32"][1]


def test_wgmma_gives_the_mma_logits(tmp_path, monkeypatch):
    """VT_CUDA_PREFILL_GEMM=wgmma on the Qwen3-0.6B shape: a 512-token prompt chunk takes the
    GEMM for qkv, gate/up and the lm_head (gemm_pays), and every logit has gemm_mma's bits."""
    from vtllm.executor.cuda_runner import CudaModelRunner
    from vtllm.kernels.cuda import WGMMA, matmul

    if not WGMMA:
        pytest.skip("wgmma needs an sm_90 (Hopper) GPU")
    launched, launch = [], matmul.gemm_wgmma
    monkeypatch.setattr(matmul, "gemm_wgmma", lambda *a, **k: (launched.append(1), launch(*a, **k)))
    loaded = load_model(write_checkpoint(tmp_path / "q", "qwen3-0.6b", seed=5, bf16=True))
    ids = np.random.default_rng(4).integers(3, loaded.config.vocab_size, 600).tolist()
    logits = {}
    for gemm in ("mma", "wgmma"):
        runner = CudaModelRunner(
            loaded,
            block_size=16,
            max_num_seqs=2,
            max_model_len=1024,
            max_num_batched_tokens=512,
            kv_cache_memory=256 << 20,
            kv_cache_fraction=0.0,
            use_graphs=False,
            kv_cache_dtype="bfloat16",
            matmul_input_dtype="bfloat16",
            cuda_prefill_gemm=gemm,
        )
        logits[gemm] = teacher_forced_logits(runner, ids, [512, 88])
        del runner
    assert launched
    np.testing.assert_array_equal(logits["wgmma"].view(np.uint32), logits["mma"].view(np.uint32))
