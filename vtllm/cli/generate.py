"""`python -m vtllm generate`: stream a completion to the terminal."""

import contextlib
import sys

from vtllm.cli import cli_settings
from vtllm.scheduler.sampling_params import SamplingParams


def load_llm(args, **overrides):
    from vtllm.cli.warmup import KernelCompileLog
    from vtllm.llm import LLM

    cli, settings = cli_settings(args)
    # Kernels compile inside LLM() (the kernel table) and its warm-up: one log line per family.
    with KernelCompileLog() if settings.device == "cpu" else contextlib.nullcontext():
        llm = LLM(cli=cli, **overrides)
        llm.warm_up()
    if settings.device == "cpu":
        from vtllm.executor.host_memory import release_start_pages

        release_start_pages("warm-up done")
    return llm


def run_generate(args) -> int:
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
    )
    if not args.prompt and not args.interactive:
        from vtllm.errors import InvalidParameter

        raise InvalidParameter("--prompt is required (or --interactive)", param="prompt")
    llm = load_llm(args)
    prompts = [args.prompt] if args.prompt else []
    if args.interactive:
        print("vtllm: type a prompt and press Enter (Ctrl-D to quit)", file=sys.stderr)
    while True:
        if not prompts:
            if not args.interactive:
                return 0
            try:
                line = input("> ").strip()
            except EOFError:
                return 0
            if not line:
                continue
            prompts.append(line)
        _stream_one(llm, prompts.pop(0), params, chat=args.chat, system=args.system)


def _stream_one(llm, prompt: str, params: SamplingParams, *, chat: bool, system: str | None):
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        prompt = llm.render_chat(messages)

    def show(_index, update):
        sys.stdout.write(update.text)
        sys.stdout.flush()

    llm.generate(prompt, params, on_update=show)
    sys.stdout.write("\n")
