"""N-gram speculation on the CPU default model: single-request (c1) decode speed with and
without it, on a copy-heavy prompt set and a plain chat set, through the offline API:

    python -m bench.spec_decode_cpu [--max-tokens 128] [--repeats 1] [--limit N] [--json]
        [--speculative-config '{"method": "ngram", "num_speculative_tokens": 3, ...}']
        [--concurrency 8,64]

Prompts are bench/prompts/copy_heavy.jsonl (repeat or edit code, summarise quoting, JSON with
repeated keys) and bench/prompts/chat_plain.jsonl, rendered with the model's chat template and
run greedily one at a time. Decode tok/s is (output tokens - 1) over the time from the first
token to the last, summed over the set (best of the repeats); the acceptance rate is accepted
over proposed tokens. Greedy outputs must be the same either way (`outputs_equal`).
`--concurrency N` adds the serving rate of N prompts (both sets, cycled) submitted at once:
output tokens over the wall time of the batch, prefill included, where speculation must not
lower the rate (past disable_by_batch_size running requests no step carries drafts).
Timings mean something only on a quiet machine (BENCHMARKS.md).
"""

import argparse
import json
import time
from pathlib import Path

from vtllm.cli.bench import machine

PROMPTS = Path(__file__).resolve().parent / "prompts"
SETS = ("copy_heavy", "chat_plain")
DEFAULT_SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                "prompt_lookup_max": 4}  # fmt: skip


def load_set(name: str) -> list[list[dict]]:
    lines = (PROMPTS / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line)["messages"] for line in lines if line.strip()]


def run_set(llm, prompts: list[str], params) -> tuple[float, int, list[list[int]]]:
    """(decode seconds, decode tokens, outputs) of the prompts run one at a time."""
    seconds, tokens, outputs = 0.0, 0, []
    for prompt in prompts:
        first = []

        def on_update(_index, delta, first=first):
            if delta.token_ids and not first:
                first.append(time.perf_counter())

        (out,) = llm.generate([prompt], params, on_update=on_update)
        ended = time.perf_counter()
        ids = out.outputs[0].token_ids
        outputs.append(ids)
        if len(ids) > 1:
            seconds += ended - first[0]
            tokens += len(ids) - 1
    return seconds, tokens, outputs


def run_batch(llm, prompts: list[str], params) -> tuple[float, int, list[list[int]]]:
    """(seconds, output tokens, outputs) of the prompts submitted at once."""
    started = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - started
    outputs = [out.outputs[0].token_ids for out in outs]
    return seconds, sum(map(len, outputs)), outputs


def compare(plain, spec, run_prompts, prompts, params, repeats: int) -> dict:
    """Best tok/s of each engine over the repeats of run_prompts(llm, prompts, params) ->
    (seconds, tokens, outputs), the ratio, the speculative runs' acceptance and whether the
    outputs agree."""
    best, outputs, steps = {}, {}, {}
    stats = spec.scheduler.spec_stats
    drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
    num_drafts = stats.num_drafts
    for _ in range(repeats):
        for label, llm in (("plain", plain), ("speculative", spec)):
            before = _loop_counters(llm.loop)
            seconds, tokens, outputs[label] = run_prompts(llm, prompts, params)
            after = _loop_counters(llm.loop)
            spent = [b - a for a, b in zip(before, after, strict=True)]
            so_far = steps.get(label, (0, 0.0, 0.0))
            steps[label] = [a + b for a, b in zip(so_far, spent, strict=True)]
            best[label] = max(best.get(label, 0.0), tokens / seconds if seconds else 0.0)
    drafted, accepted = stats.num_draft_tokens - drafted, stats.num_accepted_tokens - accepted
    emitted = sum(map(len, outputs["speculative"])) * repeats
    spec_steps, host_s, wait_s = steps["speculative"]
    plain_steps, plain_host_s, plain_wait_s = steps["plain"]
    return {
        "plain_tok_s": round(best["plain"], 1),
        "speculative_tok_s": round(best["speculative"], 1),
        "speedup": round(best["speculative"] / best["plain"], 3) if best["plain"] else None,
        "draft_tokens": drafted,
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        "outputs_equal": outputs["plain"] == outputs["speculative"],
        # where a speculative step's time goes (every repeat): tokens a step emits, steps that
        # carried drafts, and the event loop's host and waiting time a step, each engine
        "tokens_per_step": round(emitted / spec_steps, 2) if spec_steps else None,
        "steps_with_drafts": f"{stats.num_drafts - num_drafts} of {spec_steps}",
        "host_wait_us_per_step": _per_step(host_s, wait_s, spec_steps),
        "plain_host_wait_us_per_step": _per_step(plain_host_s, plain_wait_s, plain_steps),
    }


def _loop_counters(loop) -> tuple[int, float, float]:
    """(steps launched, host seconds, seconds waiting for steps) of an engine's step loop."""
    host, wait, _idle = loop.time_split(time.perf_counter())
    return loop.num_steps, host, wait


def _per_step(host_s: float, wait_s: float, steps: int) -> str | None:
    if not steps:
        return None
    return f"{host_s / steps * 1e6:.0f} / {wait_s / steps * 1e6:.0f}"


def arguments(description: str) -> argparse.ArgumentParser:
    """The options both variants take (bench/spec_decode_gpu.py adds its own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--limit", type=int, default=0, help="prompts per set (0: all)")
    parser.add_argument("--speculative-config", default=json.dumps(DEFAULT_SPEC))
    parser.add_argument("--json", action="store_true", help="JSON to stdout instead of text")
    parser.add_argument(
        "--concurrency", default="", help="serving rates of N prompts at once, e.g. 8,64"
    )
    parser.add_argument(
        "--always-wait",
        action="store_true",
        help="a speculating request always waits for its token in flight (the rule before "
        "NgramProposer.expects), for an A/B of the depth-2 rule",
    )
    return parser


def main() -> int:
    return run(arguments(__doc__.splitlines()[0]).parse_args())


def run(args, model: str | None = None, **knobs) -> int:
    """The report of both sets with an LLM of `model` and `knobs` (vtllm.config settings),
    once without and once with args.speculative_config, sharing the loaded weights."""
    from vtllm import LLM, SamplingParams
    from vtllm.scheduler.speculative import NgramProposer

    if args.always_wait:
        NgramProposer.expects = lambda self, req: True

    plain = LLM(model, **knobs)
    spec = LLM(
        model, loaded_model=plain.loaded, speculative_config=args.speculative_config, **knobs
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    report = {"machine": machine(), "max_tokens": args.max_tokens, "model": plain.loaded.name}
    report.update(knobs)
    report["speculative_config"] = json.loads(args.speculative_config)
    report["always_wait"] = args.always_wait
    for llm in (plain, spec):
        llm.generate(["warm up"], SamplingParams(temperature=0.0, max_tokens=4))
    rendered = {}
    for name in SETS:
        chats = load_set(name)[: args.limit or None]
        prompts = rendered[name] = [plain.render_chat(messages) for messages in chats]
        found = compare(plain, spec, run_set, prompts, params, args.repeats)
        # c1: decode tok/s, from each request's first token to its last
        renamed = {k.replace("_tok_s", "_decode_tok_s"): v for k, v in found.items()}
        report[name] = {"prompts": len(prompts), **renamed}
    mixed = rendered[SETS[0]] + rendered[SETS[1]]
    for n in (int(c) for c in args.concurrency.split(",") if c.strip()):
        batch = [mixed[i % len(mixed)] for i in range(n)]
        found = compare(plain, spec, run_batch, batch, params, args.repeats)
        report[f"c{n}"] = {"prompts": n, **found}
    spec.close()
    plain.close()
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for key, value in report.items():
            print(f"{key:>20}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
