#!/usr/bin/env bash
# First CUDA backend numbers on the GPU machine: c1 decode and prefill on synthetic checkpoints
# at real shapes, CUDA graphs on/off, depth 2/1, and time to ready. From the repo root:
#   source .device/bootstrap.sh && bash tools/device_bench_cuda.sh [shape ...]
# Default shapes: qwen3-0.6b llama3-8b. Prints one line per run and a table at the end.
# MODES="graphs=1 depth=2" runs only that mode (default: the three below).
set -uo pipefail
export NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0 PYTHONUNBUFFERED=1
export NUMBA_CACHE_DIR="${NUMBA_CACHE_DIR:-$PWD/.numba_cache}"
unset NUMBA_ENABLE_CUDASIM
shapes=("$@")
[ ${#shapes[@]} -eq 0 ] && shapes=(qwen3-0.6b llama3-8b)
work="${SYNTH_DIR:-/tmp/synth}"
results="$(mktemp)"
for shape in "${shapes[@]}"; do
    [ -f "$work/$shape/config.json" ] || python3 -m vtllm synth --shape "$shape" --out "$work/$shape"
    IFS=, read -ra modes <<< "${MODES:-graphs=1 depth=2,graphs=0 depth=2,graphs=1 depth=1}"
    for mode in "${modes[@]}"; do
        eval "$mode"
        started=$(date +%s.%N)
        python3 -m vtllm bench latency --model "$work/$shape" --device cuda \
            --cuda-graphs "$graphs" --async-depth "$depth" --max-num-seqs 8 --cpu-numerics exact \
            --prompt-len 128 --decode-len 128 --repeats 3 --json > "$results.json" 2> "$results.err"
        status=$?
        python3 - "$shape" "$graphs" "$depth" "$results.json" "$status" "$started" <<'PY' | tee -a "$results"
import json, sys, time
shape, graphs, depth, path, status, started = sys.argv[1:]
if status != "0":
    print(f"{shape:12s} graphs={graphs} depth={depth} FAILED (exit {status})")
    raise SystemExit
r = json.load(open(path))
r = r.get("exact", r)  # one entry per CPU numerics setting; the GPU ignores it
dec, pre = r["decode_tok_s"]["median"], r["prefill_tok_s"]["median"]
print(f"{shape:12s} graphs={graphs} depth={depth}  decode {dec:8.1f} tok/s "
      f"({1e3 / dec:6.2f} ms/token)  prefill128 {pre:9.1f} tok/s  "
      f"wall {time.time() - float(started):5.1f}s")
PY
        [ "$status" = 0 ] || tail -5 "$results.err"
        grep -h "ready in\|captured" "$results.err" | tail -2
    done
done
echo "== summary"; cat "$results"
