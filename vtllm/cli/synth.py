"""`python -m vtllm synth`: an HF-format checkpoint with random weights at a real shape."""

import time
from pathlib import Path

from vtllm.errors import InvalidParameter
from vtllm.models.synthetic import write_checkpoint


def run_synth(args) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InvalidParameter(f"--out {out} exists and is not a directory", param="out")
    if args.layers is not None and args.layers < 1:
        raise InvalidParameter(f"--layers must be at least 1, got {args.layers}", param="layers")
    started = time.perf_counter()
    write_checkpoint(
        out,
        args.shape,
        seed=args.seed,
        bf16=args.dtype == "bf16",
        peaked=args.peaked,
        tie=args.tie,
        max_position_embeddings=args.max_position_embeddings,
        layers=args.layers,
    )
    if args.gguf:
        from vtllm.models.gguf_writer import COPY_NAME, write_gguf

        write_gguf(out, out / COPY_NAME)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(
        f"{out}: {args.shape}, {args.dtype}, {size:.1f} MiB in {time.perf_counter() - started:.1f}s"
    )
    return 0
