#!/usr/bin/env bash
# vtllm's server and llama.cpp's (llama-cpp-python) on the same GGUF, same thread count, same
# bench_serve workload, one after the other in one run. Needs .venv (vtllm) and .venv-peers
# (llama-cpp-python + its server extras: fastapi uvicorn sse-starlette starlette-context
# pydantic-settings). Chat endpoint (llama-cpp-python takes no token-id prompts); EOS is masked
# with logit_bias on both, so every output is max_tokens long.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=$(.venv/bin/python -c 'from vtllm.models.default_model import default_model_path as p; print(p())')
THREADS=${THREADS:-2}
OUT=${OUT:-/tmp/compare_servers}
mkdir -p "$OUT"
BENCH=(--endpoint chat --input-len 128 --output-len 64 --warmup 2
       --extra-body '{"logit_bias": {"2": -100}}' --token-count usage --seed 1)

wait_ready() { for _ in $(seq 600); do curl -sf "$1/v1/models" >/dev/null && return 0; sleep 0.5; done; return 1; }

run_all() {  # name base-url
  for c in 1 4 16; do
    n=$(( c == 1 ? 12 : 4 * c ))
    .venv/bin/python loadtest/bench_serve.py --base-url "$2" "${BENCH[@]}" --num-prompts "$n" \
      --max-concurrency "$c" --save-json "$OUT/$1_c$c.json" > "$OUT/$1_c$c.txt" || true
    echo "$1 c=$c done"
  done
}

.venv/bin/python -m vtllm serve --port 8091 --cpu-threads "$THREADS" --log-level warning &
pid=$!; wait_ready http://127.0.0.1:8091; run_all vtllm http://127.0.0.1:8091; kill $pid; wait $pid || true

.venv-peers/bin/python -m llama_cpp.server --model "$MODEL" --n_threads "$THREADS" \
  --n_threads_batch "$THREADS" --n_ctx 4096 --port 8092 --host 127.0.0.1 >"$OUT/llamacpp.log" 2>&1 &
pid=$!; wait_ready http://127.0.0.1:8092; run_all llamacpp http://127.0.0.1:8092; kill $pid; wait $pid || true
