#!/usr/bin/env python3
"""The BENCHMARKS.md table from compare_servers.sh's bench_serve --save-json files.

    python loadtest/peers/compare_table.py /tmp/compare_servers [--runs vtllm llamacpp]

Reads OUT/<run>_c<C>.json for every run name and concurrency found, and prints one markdown
row per (concurrency, run): requests ok/failed, TTFT p50/p99, TPOT p50, output tok/s, and the
ratios of each to the peer run (the last of --runs, llamacpp by default): output tok/s as run/peer
(above 1: the run is faster), latencies as run/peer (below 1: the run is faster). A run with a
failed request is marked, since its numbers cover only the requests that passed. Where
OUT/<run>_c<C>.rss files exist (a server's VmHWM in kB), a second table gives peak RSS per
(concurrency, run) and its ratio to the peer's. Where compare_servers.sh saved vtllm's
/metrics before and after a run (OUT/<run>_c<C>.metrics.before and .metrics), a third table
splits the step loop's busy time between the two snapshots (the time on its clock,
vt:engine_seconds, less the time it had no request), per step: its own work (scheduling,
delivering tokens), awaiting the launched steps' results (the device's time the host did not
cover), and the rest: the event loop running other tasks (HTTP, SSE) while the step loop was
ready to go on. A rest that dwarfs the wait means the device waited on the host. Beside
them, from the backend: the device's busy time a step (on a GPU, between events around each
step's work), the backend thread's time enqueuing a step (its waits for the GIL included)
and the event loop thread's CPU time a step: a device busy for less than the loop's step
time waited on the host, and an event loop whose CPU time nears the step time is the limit.
"""

import argparse
import json
import os
import re
import sys


def load(out: str, runs: list[str]) -> dict[int, dict[str, dict]]:
    """{concurrency: {run: summary}} for the files present."""
    table: dict[int, dict[str, dict]] = {}
    pattern = re.compile(r"^(?P<run>.+)_c(?P<c>\d+)\.json$")
    for name in sorted(os.listdir(out)):
        m = pattern.match(name)
        if not m or m["run"] not in runs:
            continue
        with open(os.path.join(out, name)) as f:
            table.setdefault(int(m["c"]), {})[m["run"]] = json.load(f)["summary"]
    return table


def _ratio(a, b) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}"


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def rows(table: dict[int, dict[str, dict]], runs: list[str]) -> list[str]:
    peer = runs[-1]
    out = [
        "| C | server | ok / failed | TTFT p50 / p99 (ms) | TPOT p50 (ms) | out tok/s "
        f"| tok/s vs {peer} | TTFT p50 / p99 vs {peer} | TPOT p50 vs {peer} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(table):
        ref = table[c].get(peer)
        for run in runs:
            s = table[c].get(run)
            if s is None:
                continue
            ttft, tpot, tps = s["ttft_ms"], s["tpot_ms"]["median"], s["output_throughput"]
            vs = ["", "", ""]
            if ref is not None and run != peer:
                vs = [
                    _ratio(tps, ref["output_throughput"]),
                    f"{_ratio(ttft['median'], ref['ttft_ms']['median'])} / "
                    f"{_ratio(ttft['p99'], ref['ttft_ms']['p99'])}",
                    _ratio(tpot, ref["tpot_ms"]["median"]),
                ]
            mark = " (failures)" if s["failed"] else ""
            out.append(
                f"| {c} | {run}{mark} | {s['completed']} / {s['failed']} "
                f"| {_ms(ttft['median'])} / {_ms(ttft['p99'])} | {_ms(tpot)} | {tps:.1f} "
                f"| {' | '.join(vs)} |"
            )
    return out


def load_rss(out: str, runs: list[str]) -> dict[int, dict[str, float]]:
    """{concurrency: {run: peak RSS in MiB}} from the .rss files present."""
    table: dict[int, dict[str, float]] = {}
    pattern = re.compile(r"^(?P<run>.+)_c(?P<c>\d+)\.rss$")
    for name in sorted(os.listdir(out)):
        m = pattern.match(name)
        if not m or m["run"] not in runs:
            continue
        with open(os.path.join(out, name)) as f:
            text = f.read().strip()
        if text.isdigit():
            table.setdefault(int(m["c"]), {})[m["run"]] = int(text) / 1024
    return table


def rss_rows(table: dict[int, dict[str, float]], runs: list[str]) -> list[str]:
    peer = runs[-1]
    out = [f"| C | server | peak RSS (MiB) | vs {peer} |", "|---|---|---|---|"]
    for c in sorted(table):
        ref = table[c].get(peer)
        for run in runs:
            if run in table[c]:
                vs = _ratio(table[c][run], ref) if run != peer and ref else ""
                out.append(f"| {c} | {run} | {table[c][run]:.0f} | {vs} |")
    return out


LOOP_COUNTERS = (
    "vt:engine_seconds_total",
    "vt:num_steps_total",
    "vt:prompt_tokens_total",
    "vt:generation_tokens_total",
    "vt:engine_host_seconds_total",
    "vt:engine_wait_seconds_total",
    "vt:engine_idle_seconds_total",
)
# exported by later servers; a snapshot without them shows "-" in their columns
BACKEND_COUNTERS = (
    "vt:engine_device_seconds_total",
    "vt:engine_launch_seconds_total",
    "vt:event_loop_cpu_seconds_total",
)


def read_snapshot(path: str) -> dict[str, float] | None:
    """{counter: value} from a saved /metrics body, or None if it is incomplete (a server too
    old to export the step loop's seconds, or a failed scrape)."""
    values = {}
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name.split("{")[0]] = float(value)
    found = all(k in values for k in LOOP_COUNTERS)
    names = LOOP_COUNTERS + tuple(k for k in BACKEND_COUNTERS if k in values)
    return {k: values[k] for k in names} if found else None


def load_loop(out: str, runs: list[str]) -> dict[int, dict[str, dict[str, float]]]:
    """{concurrency: {run: counters after minus before}} where both snapshots are complete."""
    table: dict[int, dict[str, dict[str, float]]] = {}
    pattern = re.compile(r"^(?P<run>.+)_c(?P<c>\d+)\.metrics$")
    for name in sorted(os.listdir(out)):
        m = pattern.match(name)
        if not m or m["run"] not in runs:
            continue
        after = read_snapshot(os.path.join(out, name))
        before_path = os.path.join(out, name + ".before")
        before = read_snapshot(before_path) if os.path.exists(before_path) else None
        if after is None or before is None:
            continue
        table.setdefault(int(m["c"]), {})[m["run"]] = {
            k: after[k] - before[k] for k in after if k in before
        }
    return table


def loop_rows(table: dict[int, dict[str, dict[str, float]]], runs: list[str]) -> list[str]:
    out = [
        "| C | server | steps | prompt + output tokens a step | loop work ms a step "
        "| awaiting results ms a step | rest ms a step | device busy ms a step "
        "| launch ms a step | event loop CPU ms a step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(table):
        for run in runs:
            d = table[c].get(run)
            if d is None or d["vt:num_steps_total"] <= 0:
                continue
            steps = d["vt:num_steps_total"]
            prompt, output = d["vt:prompt_tokens_total"], d["vt:generation_tokens_total"]
            host, wait = d["vt:engine_host_seconds_total"], d["vt:engine_wait_seconds_total"]
            busy = d["vt:engine_seconds_total"] - d["vt:engine_idle_seconds_total"]
            rest = busy - host - wait
            backend = [f"{1e3 * d[k] / steps:.2f}" if k in d else "-" for k in BACKEND_COUNTERS]
            out.append(
                f"| {c} | {run} | {steps:.0f} | {prompt / steps:.1f} + {output / steps:.1f} "
                f"| {1e3 * host / steps:.2f} | {1e3 * wait / steps:.2f} "
                f"| {1e3 * rest / steps:.2f} | {' | '.join(backend)} |"
            )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="compare_table", description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="compare_servers.sh's OUT directory")
    p.add_argument("--runs", nargs="+", default=["vtllm", "llamacpp"], help="last one: the peer")
    args = p.parse_args(argv)
    if not os.path.isdir(args.out):
        print(f"compare_table: error: no directory {args.out}", file=sys.stderr)
        return 2
    table = load(args.out, args.runs)
    if not table:
        print(f"compare_table: error: no <run>_c<C>.json files in {args.out}", file=sys.stderr)
        return 2
    print("\n".join(rows(table, args.runs)))
    rss = load_rss(args.out, args.runs)
    if rss:
        print("\n" + "\n".join(rss_rows(rss, args.runs)))
    loop = loop_rows(load_loop(args.out, args.runs), args.runs)
    if len(loop) > 2:  # a row past the header
        print("\n" + "\n".join(loop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
