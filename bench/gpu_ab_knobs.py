"""One runner knob at several values, side by side in one process: c1 decode through the
offline API and the decode step's CUDA graph (GPU only) at several batch sizes. The checkpoint
is loaded once; the values run in turn, ROUNDS times over (A B A B ...), so drift in the card
shows up as spread instead of as a difference. From the repo root, on a machine with an
NVIDIA GPU and the [cuda] extra:
    python -m bench.gpu_ab_knobs CHECKPOINT_DIR cuda_pdl=true,false [--batches 1,8,32]
        [--context 1024] [--rounds 2] [--no-c1]
Values are parsed as ints where they can be, else kept as strings (true/false as bools)."""

import argparse
import statistics

from bench.gpu_ours import Bench, offline_c1_ms
from vtllm.models.loader import load_model


def parse_value(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("knob", help="NAME=V1,V2,...")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-c1", action="store_true")
    args = p.parse_args()
    name, _, values = args.knob.partition("=")
    values = [parse_value(v) for v in values.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    loaded = load_model(args.model)
    figures = {v: {} for v in values}  # value -> column -> [measurements]
    for _ in range(args.rounds):
        for v in values:
            knobs = {name: v}
            got = figures[v]
            if not args.no_c1:
                got.setdefault("c1 ms/token", []).append(offline_c1_ms(loaded, knobs=knobs))
            headroom = len(batches) * (args.steps + 3) + 16
            bench = Bench(
                loaded,
                max_batch=max(batches),
                context=args.context,
                longest_prompt=args.context,
                headroom=headroom,
                knobs=knobs,
            )
            try:
                bench.prefill_all()
                for b in batches:
                    d = bench.decode(b, args.steps)
                    got.setdefault(f"b{b} graph ms", []).append(d["gpu_ms"])
                    got.setdefault(f"b{b} step ms", []).append(d["step_ms"])
            finally:
                bench.close()
            print(name, v, {k: [round(x, 4) for x in xs] for k, xs in got.items()}, flush=True)
    columns = list(figures[values[0]])
    print(f"\n{args.model}, context {args.context}, median of {args.rounds} rounds")
    print(f"| {name} | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for v in values:
        cells = [f"{statistics.median(figures[v][c]):.3f}" for c in columns]
        print(f"| {v} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
