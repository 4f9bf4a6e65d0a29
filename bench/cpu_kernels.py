"""The CPU linear kernel's GMAC/s at the default model's shapes, by batch and threads:
python -m bench.cpu_kernels [--json]
"""

import argparse
import json
import time

import numpy as np

from vtllm.kernels import QType

SHAPES = [
    (QType.Q4_1, 576, 576),
    (QType.Q4_1, 1536, 576),
    (QType.Q4_1, 576, 1536),
    (QType.Q8_0, 49152, 576),
    (QType.F32, 1536, 576),
]


def _best_seconds(fn, repeats: int = 7) -> float:
    fn()  # compile / warm caches
    best = float("inf")
    for _ in range(repeats):
        n, started = 0, time.perf_counter()
        while n == 0 or time.perf_counter() - started < 0.05:
            fn()
            n += 1
        best = min(best, (time.perf_counter() - started) / n)
    return best


def bench_kernels(thread_counts=(1, 2), batch_sizes=(1, 512)) -> list[dict]:
    import numba

    from vtllm.kernels.cpu import linear
    from vtllm.kernels.cpu.quant import quantize

    rng = np.random.default_rng(0)
    rows = []
    for qtype, n, k in SHAPES:
        w = rng.standard_normal((n, k)).astype(np.float32)
        w = w if qtype == QType.F32 else quantize(w, qtype)
        for m in batch_sizes:
            x = rng.standard_normal((m, k)).astype(np.float32)
            out = np.empty((m, n), np.float32)
            for threads in thread_counts:
                numba.set_num_threads(threads)
                seconds = _best_seconds(lambda x=x, w=w, q=qtype, out=out: linear(x, w, q, out))
                rows.append(
                    {
                        "qtype": qtype.name,
                        "N": n,
                        "K": k,
                        "M": m,
                        "threads": threads,
                        "us": 1e6 * seconds,
                        "gmac_s": m * n * k / seconds / 1e9,
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_kernels", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = bench_kernels()
    if args.json:
        print(json.dumps({"linear": rows}, indent=2))
        return
    for r in rows:
        print(
            f"{r['qtype']:>5} {r['N']:>6}x{r['K']:<5} M={r['M']:<4} threads={r['threads']} "
            f"{r['us']:10.1f} us {r['gmac_s']:7.1f} GMAC/s"
        )


if __name__ == "__main__":
    main()
