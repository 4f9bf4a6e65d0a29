"""N-gram (or draft model) speculation on the CUDA backend: single-request (c1) decode speed
with and without it, on the same prompt sets as bench/spec_decode_cpu.py, with CUDA graphs on
(steps with and without drafts replay graphs: docs/speculative_decoding.md), and the serving
rate of many prompts at once:

    python -m bench.spec_decode_gpu [--model PATH] [--kv-cache-memory 2GiB] [--max-tokens 128]
        [--repeats 3] [--limit N] [--json] [--concurrency 8,64] [--no-graphs]
        [--speculative-config '{"method": "ngram", "num_speculative_tokens": 3, ...}']

Both engines live on the one card, so each gets a fixed KV budget rather than a fraction of
what is free. The report adds the model and the knobs to spec_decode_cpu's; `outputs_equal`
must hold (greedy outputs do not change with speculation). Timings belong in BENCHMARKS.md
with the card and the date.
"""

from bench.spec_decode_cpu import arguments, run


def main() -> int:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a checkpoint (default: the default model)")
    parser.add_argument("--kv-cache-memory", default="2GiB", help="each engine's KV budget")
    parser.add_argument("--no-graphs", action="store_true", help="every step eagerly")
    args = parser.parse_args()
    knobs = dict(
        device="cuda", kv_cache_memory=args.kv_cache_memory, cuda_graphs=not args.no_graphs
    )
    return run(args, args.model, **knobs)


if __name__ == "__main__":
    raise SystemExit(main())
