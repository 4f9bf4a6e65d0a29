"""`python -m vtllm bench latency|throughput`: speed of the offline engine on this machine."""

import gc
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from vtllm.cli import cli_settings
from vtllm.scheduler.sampling_params import SamplingParams

PEER_SCRIPT = Path(__file__).resolve().parents[2] / "loadtest" / "peers" / "llamacpp_latency.py"


def _random_prompt(vocab: int, n: int, seed: int) -> list[int]:
    # Skip the low ids, where the special tokens of most vocabularies sit.
    return np.random.default_rng(seed).integers(100, vocab, n).tolist()


def _reset_peak_rss() -> bool:
    """Starts VmHWM over from the present RSS (Linux: "5" into /proc/self/clear_refs), so that
    an engine run after another reports its own peak; False where the kernel has no such knob."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mib() -> float:
    try:  # VmHWM: the peak of this process image (ru_maxrss survives exec)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def machine(cpuinfo: str | None = None) -> str:
    """The CPU model, its usable cores and its SIMD features: rows of different machines must
    never be compared, and the kernels' speed depends on these features."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model, flags = platform.processor() or "unknown CPU", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            break
    try:
        import os

        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = 0
    features = " ".join(f for f in SIMD_FLAGS if f in flags) or "no AVX2"
    return f"{model}, {cores} cores usable, {features}"


def run_bench(args) -> int:
    from vtllm.cli.generate import load_llm

    if args.bench == "latency":
        overrides = {"enable_prefix_caching": False}
        if args.max_num_batched_tokens is None:
            overrides["max_num_batched_tokens"] = max(2048, args.prompt_len)
        # On the CPU without --cpu-numerics both numerics run, on the same loaded weights, then
        # the peer; the knob means nothing on a GPU, where one run is made.
        _, settings = cli_settings(args)
        if args.cpu_numerics or settings.device != "cpu":
            numerics = [settings.cpu_numerics]
        else:
            numerics = ["exact", "fast"]
        report, loaded = {"machine": machine()}, None
        if "fast" in numerics and settings.device == "cpu":  # its dot product's spelling
            from vtllm.kernels.cpu._int8simd import INT8_VARIANT

            report["int8_kernels"] = INT8_VARIANT
        for name in numerics:
            # the later engine's peak: its own, over the weights it shares with the earlier one
            own_peak = loaded is None or _reset_peak_rss()
            llm = load_llm(args, cpu_numerics=name, loaded_model=loaded, **overrides)
            loaded = llm.loaded
            report[name] = bench_latency(llm, args.prompt_len, args.decode_len, args.repeats)
            if not own_peak:
                report[name]["peak_rss_of"] = "the process, the engines before this one included"
            llm.backend.close()  # its worker thread, before the next engine starts
            del llm
            gc.collect()
        if args.peer_python:
            peer = run_peer(args.peer_python, loaded, report[numerics[0]]["threads"], args)
            report["llama.cpp"] = peer
            report["ratios"] = _ratios(report, numerics)
        _print(report, args.json)
        return 0
    from vtllm.cli.throughput import bench_throughput

    llm = load_llm(args)
    report = bench_throughput(
        llm, args.num_prompts, args.input_len, args.output_len, args.concurrency
    )
    if isinstance(report, dict):
        report = {"machine": machine(), **report}
    _print(report, args.json)
    return 0


def bench_latency(llm, prompt_len: int, decode_len: int, repeats: int) -> dict:
    vocab = llm.loaded.config.vocab_size
    prefill = []
    for r in range(repeats):
        ids = _random_prompt(vocab, prompt_len, seed=r)
        started = time.perf_counter()
        llm.generate(ids, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
        prefill.append(prompt_len / (time.perf_counter() - started))
    decode = []
    for r in range(repeats):
        stamps: list[float] = []

        def stamp(_index, update, stamps=stamps):
            stamps.extend([time.perf_counter()] * len(update.token_ids))

        ids = _random_prompt(vocab, 16, seed=100 + r)
        params = SamplingParams(temperature=0.0, max_tokens=decode_len + 1, ignore_eos=True)
        llm.generate(ids, params, on_update=stamp)
        decode.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    return {
        "engine": "vtllm",
        "model": str(llm.loaded.path),
        "threads": llm.threads,
        "async_depth": llm.config.async_depth,
        "cpu_numerics": llm.config.cpu_numerics,
        "prompt_len": prompt_len,
        "decode_len": decode_len,
        "prefill_tok_s": {"best": max(prefill), "median": statistics.median(prefill)},
        "decode_tok_s": {"best": max(decode), "median": statistics.median(decode)},
        "peak_rss_mib": _peak_rss_mib(),
        "cpu": platform.processor() or platform.machine(),
    }


def _ratios(report: dict, numerics: list[str]) -> dict:
    """vtllm median / llama.cpp median, per numerics and phase."""
    peer = report["llama.cpp"]
    if "error" in peer:
        return {}
    out = {}
    for name in numerics:
        for phase in ("prefill", "decode"):
            ours = report[name][f"{phase}_tok_s"]["median"]
            out[f"{name} {phase}"] = round(ours / peer[f"{phase}_tok_s_median"], 3)
    return out


def run_peer(python: str, loaded, threads: int, args) -> dict:
    cmd = [
        python,
        str(PEER_SCRIPT),
        "--model",
        str(loaded.path),
        "--threads",
        str(threads),
        "--prompt-len",
        str(args.prompt_len),
        "--decode-len",
        str(args.decode_len),
        "--repeats",
        str(args.repeats),
        "--json",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["peer failed"]}
    return json.loads(done.stdout)


def _print(report: dict, as_json: bool) -> None:
    if as_json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    for key, value in report.items():
        print(f"{key:>16}: {value}")
