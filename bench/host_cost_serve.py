#!/usr/bin/env python3
"""What the server's event-loop thread spends a streamed token, measured on any machine.

    python -m bench.host_cost_serve [--concurrency 64] [--prompts 512] [--repeat 3] [-- SERVE ARGS]

Starts `vtllm serve` on a tiny synthetic model (so the model's own step is a small part of
the CPU time), runs loadtest/bench_serve.py against it (completions, streamed, 128-token
prompts, 64 output tokens, ignore_eos), and reads the server's per-thread CPU time from
/proc before and after each run. The main thread runs the event loop: HTTP, SSE framing,
the step loop's scheduling and detokenizing; its CPU microseconds per output token bound the
streamed tokens a second one process can serve, whatever the device computes. The client's
CPU a token is printed too: where it nears a core's worth, the client sets the pace. The model
runs on one CPU thread (`--cpu-threads 1`), leaving the other cores to the event loop and the
client. Linux only.
"""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[int, float]:
    """user + system CPU seconds of each thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended between listdir and open
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"the server was not ready in {timeout_s:.0f}s")


def children_cpu_s() -> float:
    """CPU seconds of the children waited for so far (the bench_serve runs; the server is
    waited for only at the end)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench(url: str, args, seed: int) -> float:
    cmd = [
        sys.executable,
        os.path.join(ROOT, "loadtest", "bench_serve.py"),
        "--base-url",
        url,
        "--endpoint",
        "completions",
        "--input-len",
        "128",
        "--output-len",
        "64",
        "--ignore-eos",
        "--temperature",
        "0",
        "--token-count",
        "usage",
        "--token-range",
        "3:500",
        "--num-prompts",
        str(args.prompts),
        "--warmup",
        "0",
        "--max-concurrency",
        str(args.concurrency),
        "--seed",
        str(seed),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"bench_serve failed ({run.returncode}): {run.stderr.strip()[-400:]}")
    found = re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", run.stdout)
    return float(found.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--port", type=int, default=8391)
    p.add_argument("serve_args", nargs="*", help="after --: more `vtllm serve` flags")
    args = p.parse_args()
    url = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny")
        synth = [sys.executable, "-m", "vtllm", "synth", "--shape", "tiny", "--out", model]
        subprocess.run(synth, check=True, capture_output=True)
        serve = [
            sys.executable,
            "-m",
            "vtllm",
            "serve",
            "--model",
            model,
            "--port",
            str(args.port),
            "--max-num-seqs",
            str(args.concurrency),
            "--cpu-threads",
            "1",
            *args.serve_args,
        ]
        proc = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_healthy(url, proc)
            bench(url, args, seed=0)  # warm-up: compiles, fills the pools
            tokens = args.prompts * 64
            print("run  out tok/s  main thread us/token  other threads us/token  client us/token")
            mains = []
            for run in range(1, args.repeat + 1):
                before, client_before = thread_cpu_s(proc.pid), children_cpu_s()
                rate = bench(url, args, seed=run)
                after, client_s = thread_cpu_s(proc.pid), children_cpu_s() - client_before
                main_s = after[proc.pid] - before.get(proc.pid, 0.0)
                rest_s = sum(s - before.get(t, 0.0) for t, s in after.items()) - main_s
                mains.append(main_s / tokens * 1e6)
                print(
                    f"{run:3d}  {rate:10.0f}  {mains[-1]:20.1f}  {rest_s / tokens * 1e6:22.1f}"
                    f"  {client_s / tokens * 1e6:15.1f}"
                )
            print(f"median main thread: {statistics.median(mains):.1f} us/token")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
