"""Command line: generate, bench, config. User errors print one line and exit with code 2."""

import argparse
import sys

from vtllm.errors import VtllmError


def _build_parser() -> argparse.ArgumentParser:
    from vtllm import config
    from vtllm.models.synthetic import SHAPES

    parser = argparse.ArgumentParser(prog="vtllm", description="LLM inference with numba kernels")
    sub = parser.add_subparsers(dest="command", required=True)

    srv = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    config.add_flags(srv)

    gen = sub.add_parser("generate", help="generate text, streaming it to the terminal")
    config.add_flags(gen)
    gen.add_argument("--prompt", help="the prompt (or the user message with --chat)")
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template")
    gen.add_argument("--system", help="system message for --chat")
    gen.add_argument("--interactive", action="store_true", help="read prompts from stdin")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--ignore-eos", action="store_true")

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    lat = bench_sub.add_parser("latency", help="prefill and decode speed, peak RSS")
    config.add_flags(lat)
    lat.add_argument("--prompt-len", type=int, default=512)
    lat.add_argument("--decode-len", type=int, default=64)
    lat.add_argument("--repeats", type=int, default=3)
    lat.add_argument("--json", action="store_true")
    lat.add_argument(
        "--peer-python", help="python of a venv with llama-cpp-python: measure llama.cpp too"
    )
    thr = bench_sub.add_parser("throughput", help="offline throughput over many requests")
    config.add_flags(thr)
    thr.add_argument("--num-prompts", type=int, default=64)
    thr.add_argument("--input-len", type=int, default=128)
    thr.add_argument("--output-len", type=int, default=64)
    thr.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    thr.add_argument("--json", action="store_true")

    syn = sub.add_parser("synth", help="write an HF-format checkpoint with random weights")
    syn.add_argument("--shape", required=True, choices=sorted(SHAPES))
    syn.add_argument("--out", required=True, help="directory to write")
    syn.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument(
        "--peaked",
        action="store_true",
        help="wide logit margins: greedy paths agree across engines",
    )
    syn.add_argument("--tie", action="store_true", help="tie the output head to the embedding")
    syn.add_argument("--max-position-embeddings", type=int, default=8192)
    syn.add_argument(
        "--layers", type=int, help="fewer layers than the shape has: quick per-layer profiles"
    )
    syn.add_argument(
        "--gguf", action="store_true", help="also OUT/model-f16.gguf, a GGUF copy for llama.cpp"
    )

    cfg = sub.add_parser("config", help="print every knob, its value and where it came from")
    config.add_flags(cfg)
    cfg.add_argument("--markdown", action="store_true", help="print the README's knob table")
    return parser


def main(argv=None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            from vtllm.cli.serve import run_serve

            return run_serve(args)
        if args.command == "generate":
            from vtllm.cli.generate import run_generate

            return run_generate(args)
        if args.command == "bench":
            from vtllm.cli.bench import run_bench

            return run_bench(args)
        if args.command == "synth":
            from vtllm.cli.synth import run_synth

            return run_synth(args)
        if args.command == "config":
            from vtllm.cli.show_config import run_config

            return run_config(args)
    except VtllmError as exc:
        print(f"vtllm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
