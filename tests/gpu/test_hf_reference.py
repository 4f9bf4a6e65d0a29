"""The CUDA backend against HF transformers on the GPU, on synthetic bf16 checkpoints.

Teacher-forced: both run the same ids and logits are compared per position. The reference is
HF in float32 (the bf16 weights upcast: the math vtllm's kernels do, fp32 accumulation over
bf16 weights) for the logits bound, and HF in bf16 for argmax agreement wherever its top-2
margin exceeds the bf16 noise, taken as 4x the largest |bf16 - fp32| HF shows at that position.
With peaked logits, greedy decoding is compared token for token over 128 tokens.
"""

import numpy as np
import pytest

from tests.models.runner_util import teacher_forced_logits
from vtllm.models.loader import load_model
from vtllm.models.synthetic import write_checkpoint

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SHAPES = ["tiny", "tiny-qwen3", "tiny-qwen2", "qwen3-0.6b"]


def _hf(directory, dtype):
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
    return model.to("cuda").eval()


def _hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.tensor([ids], device="cuda"))
    return out.logits[0].float().cpu().numpy()


def _runner(loaded, kv_cache_dtype="float32", matmul_input_dtype="float32", flash=False):
    """flash: prompt rows past the 4 that take the decode kernels attend on tensor cores."""
    from vtllm.executor.cuda_runner import CudaModelRunner

    return CudaModelRunner(
        loaded,
        block_size=16,
        max_num_seqs=4,
        max_model_len=512,
        max_num_batched_tokens=512,
        kv_cache_memory=256 << 20,
        kv_cache_fraction=0.0,
        use_graphs=False,
        kv_cache_dtype=kv_cache_dtype,
        matmul_input_dtype=matmul_input_dtype,
        split_attention_rows=4 if flash else 0,
        cuda_flash_prefill=flash,
    )


@pytest.mark.parametrize(
    ("kv", "matmul", "flash"),
    [
        ("float32", "float32", False),
        ("bfloat16", "float32", False),
        ("float32", "bfloat16", False),
        ("bfloat16", "bfloat16", True),
    ],
    ids=["f32", "bf16-kv", "bf16-inputs", "flash"],
)
@pytest.mark.parametrize("shape", SHAPES)
def test_teacher_forced_logits(tmp_path, monkeypatch, shape, kv, matmul, flash):
    """Either KV cache dtype and either matmul input dtype: bf16 K/V (as HF's bf16 model keeps
    them) or activations rounded to bf16 before the tensor cores (as HF's bf16 model feeds
    them) stay within the same bounds; so does attention on tensor cores for prompt rows
    (flash: bf16 q and softmax weights, as HF's bf16 model computes them)."""
    from vtllm.kernels.cuda import _attention_flash as attention_flash

    launched, launch = [], attention_flash.flash_prefill
    monkeypatch.setattr(
        attention_flash, "flash_prefill", lambda *a, **k: (launched.append(1), launch(*a, **k))
    )
    directory = write_checkpoint(tmp_path / shape, shape, seed=3, bf16=True)
    loaded = load_model(directory)
    ids = np.random.default_rng(2).integers(3, loaded.config.vocab_size, 96).tolist()
    # a prefill chunk, then steps of decode size (the norms folded into the linears), then more
    ours = teacher_forced_logits(_runner(loaded, kv, matmul, flash), ids, [40, 1, 7, 48])
    assert bool(launched) == flash
    ref32 = _hf_logits(_hf(directory, torch.float32), ids)
    ref16 = _hf_logits(_hf(directory, torch.bfloat16), ids)
    scale = np.abs(ref32).max(axis=1)
    rel = np.abs(ours - ref32).max(axis=1) / scale
    noise = 4 * np.abs(ref16 - ref32).max(axis=1)
    top2 = np.sort(ref16, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > noise
    agree = ours.argmax(1) == ref16.argmax(1)
    n_clear = int(clear.sum())
    hf16 = (np.abs(ref16 - ref32).max(axis=1) / scale).max()
    print(
        f"{shape}, {kv} KV, {matmul} matmul inputs, flash {flash}: max relative error vs fp32 "
        f"{rel.max():.2e} (HF bf16: {hf16:.2e}); argmax vs bf16 equal at "
        f"{agree[clear].sum()}/{n_clear} clear positions ({agree.mean():.0%} overall)"
    )
    assert rel.max() < 1e-2
    assert agree[clear].all()
    assert (ours.argmax(1) == ref32.argmax(1))[clear].all()


def _hf_greedy(model, prompt, n) -> list[int]:
    """Argmax decoding with HF's KV cache and no eos handling (vtllm runs with ignore_eos)."""
    ids, past, out = torch.tensor([prompt], device="cuda"), None, []
    with torch.no_grad():
        for _ in range(n):
            step = model(ids, past_key_values=past, use_cache=True)
            past = step.past_key_values
            out.append(int(step.logits[0, -1].argmax()))
            ids = torch.tensor([[out[-1]]], device="cuda")
    return out


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen3", "qwen3-0.6b"])
def test_peaked_greedy_128_tokens_token_exact(tmp_path, shape):
    from vtllm.llm import LLM
    from vtllm.scheduler.sampling_params import SamplingParams

    directory = write_checkpoint(tmp_path / shape, shape, seed=4, bf16=True, peaked=True)
    prompt = np.random.default_rng(5).integers(3, 500, 12).tolist()
    ref = _hf_greedy(_hf(directory, torch.float32), prompt, 128)
    llm = LLM(
        str(directory),
        device="cuda",
        max_num_seqs=4,
        kv_cache_memory=256 << 20,
        max_model_len=512,
        kv_cache_dtype="float32",
        matmul_input_dtype="float32",
    )
    try:
        got = llm.generate(
            [prompt], SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
        )[0]
    finally:
        llm.close()
    ours = got.outputs[0].token_ids
    first = next((i for i, (a, b) in enumerate(zip(ours, ref, strict=True)) if a != b), None)
    assert first is None, f"first difference at token {first}: {ours[first]} vs {ref[first]}"
