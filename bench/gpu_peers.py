"""The card's ceilings and the peers of bench.gpu: torch, HF transformers, llama.cpp.

Everything here talks to torch or to llama.cpp's binaries, imported or started inside the
functions, so that the module loads on a machine with neither. The kernel micro-benchmarks
are this package's gpu_linear, gpu_attention and gpu_profile_decode, run as they are.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_GEN = 128  # tokens llama.cpp generates per test (its llama-bench default)


def machine() -> dict:
    import torch

    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def torch_ms(fn, reps: int = 20, rounds: int = 10) -> float:
    """Median per call of fn launched reps times between two CUDA events, after a warm-up."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


def card_ceilings(size: int = 2 << 30) -> dict:
    """Streaming bandwidth two ways (a device-to-device copy counting bytes read and written;
    a bf16 GEMV, decode's own access pattern, counting the matrix once) and the bf16 GEMM
    rate at 8192^3. The floors use the better bandwidth: the harder target."""
    import torch

    copy_gb_s, gemv_gb_s = _copy_gb_s(size), _gemv_gb_s(size)
    gemm_tflop_s = _gemm_tflop_s(8192)
    torch.cuda.empty_cache()
    return {
        "copy_gb_s": round(copy_gb_s),
        "gemv_gb_s": round(gemv_gb_s),
        "bandwidth_gb_s": round(max(copy_gb_s, gemv_gb_s)),
        "gemm_tflop_s": round(gemm_tflop_s, 1),
    }


def _copy_gb_s(size: int) -> float:
    import torch

    a = torch.empty(size // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    return 2 * size / torch_ms(lambda: b.copy_(a)) / 1e6


def _gemv_gb_s(size: int) -> float:
    import torch

    w = torch.randn(16384, size // 2 // 16384, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(1, w.shape[1], dtype=torch.bfloat16, device="cuda")
    return size / torch_ms(lambda: torch.nn.functional.linear(x, w)) / 1e6


def _gemm_tflop_s(n: int) -> float:
    import torch

    p = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    return 2 * n**3 / torch_ms(lambda: p @ q, reps=10) / 1e9


# -- HF transformers -------------------------------------------------------------------------


def hf_figures(ckpt: Path, settings) -> dict:
    """HF transformers in bf16 on the same checkpoint (its default attention, no compile)."""
    import gc

    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16)
    model = model.to("cuda", torch.bfloat16).eval()
    try:
        with torch.inference_mode():
            figures = _hf_measure(model, settings)
    finally:
        del model
        gc.collect()
        torch.cuda.empty_cache()
    figures["c1_ms"] = figures["decode"].get("1", {}).get("step_ms")
    figures["transformers"] = transformers.__version__
    return figures


def _hf_measure(model, settings) -> dict:
    """Decode with HF's KV cache at each batch size after a context-token prompt, wall time
    per step over settings.steps steps (after 3); TTFT per prompt length, median of 3 after a
    warm-up. The argmax token stays on the GPU, so the host need not wait on each step (a
    kinder loop than `model.generate`, which checks its stopping criteria every step)."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)

    def prompt(batch, n):
        return torch.randint(100, model.config.vocab_size, (batch, n), device="cuda", generator=gen)

    def step(ids, past=None):
        out = model(input_ids=ids, past_key_values=past, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1:].argmax(-1), out.past_key_values

    decode, ttft = {}, {}
    for batch in sorted(settings.batches):
        token, past = step(prompt(batch, settings.context))
        for _ in range(3):
            token, past = step(token, past)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(settings.steps):
            token, past = step(token, past)
        torch.cuda.synchronize()
        decode[str(batch)] = {"step_ms": 1e3 * (time.perf_counter() - started) / settings.steps}
        del past, token
        torch.cuda.empty_cache()
    for n in settings.prompts:
        times = []
        for i in range(4):
            ids = prompt(1, n)
            torch.cuda.synchronize()
            started = time.perf_counter()
            step(ids)[0].item()
            if i:
                times.append(1e3 * (time.perf_counter() - started))
        ttft[str(n)] = statistics.median(times)
    return {"decode": decode, "ttft_ms": ttft}


# -- llama.cpp -------------------------------------------------------------------------------


def llamacpp_figures(llama_bench: str, gguf: str, settings) -> dict:
    """llama-bench (c1 generation from an empty context, prompt processing per length) and,
    if it sits beside it, llama-batched-bench (generation at each batch size after a
    context-token prompt). All layers on the GPU (-ngl 99), llama.cpp's other defaults."""
    bench = Path(llama_bench)
    cmd = [
        str(bench),
        "-m",
        gguf,
        "-ngl",
        "99",
        "-o",
        "json",
        "-p",
        ",".join(map(str, settings.prompts)),
        "-n",
        str(LLAMA_GEN),
    ]
    out = parse_llama_bench(_run(cmd))
    batched = bench.with_name("llama-batched-bench")
    if batched.exists():
        npl = ",".join(map(str, sorted(settings.batches)))
        ctx = max(settings.batches) * (settings.context + LLAMA_GEN) + 256
        cmd = [
            str(batched),
            "-m",
            gguf,
            "-ngl",
            "99",
            "-c",
            str(ctx),
            "-npp",
            str(settings.context),
            "-ntg",
            str(LLAMA_GEN),
            "-npl",
            npl,
        ]
        out["decode"] = parse_batched_bench(_run(cmd))
    else:
        out["decode_error"] = f"{batched} not found"
    return out


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{Path(cmd[0]).name} exited {done.returncode}: {' / '.join(tail)}")
    return done.stdout + "\n" + done.stderr


def parse_llama_bench(text: str) -> dict:
    """llama-bench's `-o json` list: generation tests give c1 ms/token, prompt tests the
    time to process the prompt (TTFT less the one sampled token)."""
    start, end = text.find("["), text.rfind("]")
    tests = json.loads(text[start : end + 1])
    out = {"c1_ms": None, "ttft_ms": {}}
    for t in tests:
        seconds = t["avg_ns"] / 1e9 if "avg_ns" in t else None
        if t.get("n_prompt", 0) == 0 and t.get("n_gen", 0) > 0:
            ms = 1e3 * seconds / t["n_gen"] if seconds else 1e3 / t["avg_ts"]
            out["c1_ms"] = ms
        elif t.get("n_gen", 0) == 0 and t.get("n_prompt", 0) > 0:
            ms = 1e3 * seconds if seconds else 1e3 * t["n_prompt"] / t["avg_ts"]
            out["ttft_ms"][str(t["n_prompt"])] = ms
    return out


def parse_batched_bench(text: str) -> dict:
    """llama-batched-bench's markdown table: per batch size (column B, or PL), the time per
    generation step, T_TG / TG."""
    header, out = None, {}
    for line in text.splitlines():
        if not line.strip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "S_TG t/s" in cells:
            header = cells
            continue
        if header is None or len(cells) != len(header) or cells[0].startswith("-"):
            continue
        row = dict(zip(header, cells, strict=True))
        batch = row.get("B", row.get("PL"))
        step_ms = 1e3 * float(row["T_TG s"]) / float(row["TG"])
        out[str(int(batch))] = {"step_ms": step_ms, "tok_s": float(row["S_TG t/s"])}
    if not out:
        raise ValueError("no llama-batched-bench table in its output")
    return out


# -- kernel micro-benchmarks -----------------------------------------------------------------


def kernel_tools(checkpoints: list[Path], settings) -> dict:
    """The kernel micro-benchmarks, their printed tables by name: linear kernels against
    torch (M=1..64; the prefill GEMM at 128..4096 rows), decode attention against torch SDPA,
    and the per-op profile of a decode step of each checkpoint at batch 1 and 32."""
    py = [sys.executable, "-m"]
    runs = {
        "decode linear vs torch": [*py, "bench.gpu_linear", "--prefill", ""],
        "prefill GEMM vs torch": [*py, "bench.gpu_linear", "--gemm"],
        "attention vs torch SDPA": [*py, "bench.gpu_attention"],
    }
    for ckpt in checkpoints:
        for batch in (1, 32):
            runs[f"decode profile {ckpt.name} batch {batch}"] = [
                *py,
                "bench.gpu_profile_decode",
                ckpt,
                "--batch",
                str(batch),
                "--context",
                str(settings.context),
            ]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    out = {}
    for name, cmd in runs.items():
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [str(c) for c in cmd],
                capture_output=True,
                text=True,
                timeout=1200,
                cwd=ROOT,
                env=env,
            )
            text = done.stdout if done.returncode == 0 else done.stdout + done.stderr[-2000:]
            text += f"(exit {done.returncode}, {time.perf_counter() - started:.0f}s)"
        except subprocess.TimeoutExpired:
            text = "timed out after 1200s"
        out[name] = text
        print(f"[bench.gpu] {name}: {text.splitlines()[-1]}", file=sys.stderr, flush=True)
    return out
