"""`python -m bench.gpu_tp`: tensor parallelism on GPUs through the engine, the sizes side by
side in one run (same cards, same checkpoint, one engine at a time).

From the repository root, on a host with N NVIDIA GPUs and the [cuda] extra (NCCL included):
    python -m bench.gpu_tp [--shape llama3-8b] [--tensor-parallel-size 1,2] [--batch 32]
        [--decode 128] [--work /tmp/vtllm-bench-gpu] [--json]

For each size N, LLM(..., device="cuda", tensor_parallel_size=N) with graphs (N = 1 is the
one-GPU backend, N > 1 one worker process a GPU, NCCL inside each step's graph):
- c1: decode ms per token of one request, between its first and last token, median of 3 (as
  `vtllm bench latency` and bench.gpu's c1 row measure it);
- b{batch}: `batch` requests of a 16-token prompt decoding together, output tokens per second
  and wall ms per decode step.
The checkpoint is bench.gpu's synthetic bf16 one (written under --work when missing). This
module stays importable without a GPU (argument parsing, the table).
"""

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

PROMPT = 16


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_tp",
        description="GPU tensor parallelism: c1 and batched decode at each size, one run",
    )
    parser.add_argument("--shape", default="llama3-8b", help="a synthetic shape")
    parser.add_argument("--layers", type=int, help="fewer layers than the shape has")
    parser.add_argument("--work", default="/tmp/vtllm-bench-gpu", help="checkpoints live here")
    parser.add_argument(
        "--tensor-parallel-size", default="1,2", help="the sizes to compare, e.g. 1,2,4,8"
    )
    parser.add_argument("--batch", type=int, default=32, help="requests decoding together")
    parser.add_argument("--decode", type=int, default=128, help="tokens decoded a request")
    parser.add_argument("--json", action="store_true", help="JSON instead of the table")
    return parser


def sizes(text: str) -> list[int]:
    out = [int(t) for t in text.split(",") if t.strip()]
    if not out or min(out) < 1:
        raise ValueError(f"--tensor-parallel-size: positive integers, got {text!r}")
    return out


def checkpoint(work: str, shape: str, layers: int | None) -> Path:
    from vtllm.models.synthetic import write_checkpoint

    out = Path(work) / (shape if layers is None else f"{shape}-{layers}L")
    if not (out / "config.json").exists():
        print(f"writing the synthetic checkpoint {out}", file=sys.stderr, flush=True)
        write_checkpoint(out, shape, bf16=True, max_position_embeddings=8192, layers=layers)
    return out


def measure(path: Path, loaded, n: int, batch: int, decode: int) -> dict:
    import numpy as np

    from vtllm.cli.bench import bench_latency
    from vtllm.llm import LLM
    from vtllm.scheduler.sampling_params import SamplingParams

    llm = LLM(
        str(path),
        loaded_model=loaded,
        device="cuda",
        tensor_parallel_size=n,
        max_num_seqs=max(8, batch),
        enable_prefix_caching=False,
        max_model_len=4096,
    )
    try:
        llm.warm_up()
        c1 = bench_latency(llm, PROMPT, decode, 3)["decode_tok_s"]["median"]
        rng = np.random.default_rng(0)
        prompts = [
            rng.integers(100, loaded.config.vocab_size, PROMPT).tolist() for _ in range(batch)
        ]
        params = SamplingParams(temperature=0.0, max_tokens=decode, ignore_eos=True)
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            outputs = llm.generate(prompts, params)
            elapsed = time.perf_counter() - started
            runs.append(sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed)
    finally:
        llm.close()
    del llm
    gc.collect()  # the engine's device buffers go before the next size's engine starts
    tok_s = statistics.median(runs)
    return {"c1_ms": 1e3 / c1, "batch_tok_s": tok_s, "batch_step_ms": 1e3 * batch / tok_s}


def format_table(rows: dict, batch: int) -> str:
    base = rows.get(1)
    lines = [f"| TP | c1 ms/token | b{batch} tok/s | b{batch} ms/step | b{batch} vs TP=1 |"]
    lines.append("|---|---|---|---|---|")
    for n, r in rows.items():
        ratio = f"{r['batch_tok_s'] / base['batch_tok_s']:.2f}x" if base else "-"
        lines.append(
            f"| {n} | {r['c1_ms']:.2f} | {r['batch_tok_s']:.0f} | {r['batch_step_ms']:.2f} "
            f"| {ratio} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    from vtllm.models.loader import load_model

    args = build_parser().parse_args(argv)
    path = checkpoint(args.work, args.shape, args.layers)
    loaded = load_model(path)
    rows = {}
    for n in sizes(args.tensor_parallel_size):
        print(f"TP = {n}: {args.shape}", file=sys.stderr, flush=True)
        rows[n] = measure(path, loaded, n, args.batch, args.decode)
    if args.json:
        print(json.dumps({"shape": args.shape, "batch": args.batch, "rows": rows}, indent=1))
    else:
        print(format_table(rows, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
