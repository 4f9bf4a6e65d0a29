"""Constrained decoding's cost on the CPU default model: the same 16 prompts, sampled with and
without a JSON-schema constraint, all 16 in flight at once (c16), through the offline API:

    python -m bench.structured_cpu [--repeats 3] [--max-tokens 96] [--json]

Throughput is output tokens over wall time (best of the repeats, runs alternated); every
request runs max_tokens (ignore_eos: once its grammar is complete a constrained request may only
end, so it samples the end token until then), so both batches stay full to the end. The per-token
mask time replays every constrained output through a fresh constraint on the host: computing the
next token's mask and feeding the token, as the step loop does between steps.
"""

import argparse
import json
import time

from vtllm.cli.bench import machine

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 6},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "hobbies", "city"],
    "additionalProperties": False,
}
TOPICS = ["a pilot", "a baker", "a chess player", "a nurse", "a painter", "a farmer", "a coder"]


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", action="store_true", help="JSON to stdout instead of text")
    args = parser.parse_args()

    from vtllm import LLM, SamplingParams
    from vtllm.scheduler.sampling_params import StructuredOutputs

    llm = LLM()
    prompts = [
        llm.render_chat(
            [{"role": "user", "content": f"Describe {TOPICS[i % len(TOPICS)]} (#{i}) as JSON."}]
        )
        for i in range(args.concurrency)
    ]

    def params(constrained: bool) -> list:
        spec = StructuredOutputs(json=SCHEMA) if constrained else None
        return [
            SamplingParams(
                temperature=0.8,
                max_tokens=args.max_tokens,
                ignore_eos=True,  # every request runs max_tokens: the batch stays full in both
                seed=i,
                structured_outputs=spec,
            )
            for i in range(len(prompts))
        ]

    best = {False: 0.0, True: 0.0}
    outputs = {}
    llm.generate(prompts[:2], params(True)[:2])  # grammar engine's tokenizer, kernels
    for _ in range(args.repeats):
        for constrained in (False, True):
            started = time.perf_counter()
            outs = llm.generate(prompts, params(constrained))
            seconds = time.perf_counter() - started
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            best[constrained] = max(best[constrained], tokens / seconds)
            outputs[constrained] = outs

    # per-token host cost: mask + accept, replayed on the constrained outputs
    constraints = llm.loop.constraints
    replayed, seconds = 0, 0.0
    for out, p in zip(outputs[True], params(True), strict=True):
        c = constraints.build(p)
        started = time.perf_counter()
        for token in out.outputs[0].token_ids:
            c.next_mask()
            c.accept(token)
        seconds += time.perf_counter() - started
        replayed += len(out.outputs[0].token_ids)
    valid = sum(_is_json(o.outputs[0].text) for o in outputs[True])
    report = {
        "machine": machine(),
        "concurrency": len(prompts),
        "max_tokens": args.max_tokens,
        "unconstrained_tok_s": round(best[False], 1),
        "json_schema_tok_s": round(best[True], 1),
        "ratio": round(best[True] / best[False], 3),
        "mask_us_per_token": round(1e6 * seconds / max(replayed, 1), 1),
        "constrained_outputs_that_parse": f"{valid}/{len(prompts)}",
    }
    llm.close()
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for key, value in report.items():
            print(f"{key:>36}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
