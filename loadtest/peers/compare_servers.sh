#!/usr/bin/env bash
# vtllm's HTTP server against llama.cpp's own `llama-server` (build_llama_server.sh) on the same
# GGUF file, thread count and slot count, with the same bench_serve workload, in one run:
# for each concurrency C, start vtllm, benchmark it, stop it, then the same for llama-server.
# Both get a fresh process per C with C slots (vtllm --max-num-seqs C, llama-server --parallel C)
# and MAX_MODEL_LEN tokens of context per slot (default 4096, vtllm's default --max-model-len).
#
#   flock -x /tmp/vtllm-cpu.lock bash loadtest/peers/compare_servers.sh
#
# Environment: THREADS (2), CONCURRENCY ("1 4 16"), OUT (/tmp/compare_servers),
# LLAMA_SERVER (.peers-build/build/bin/llama-server), VT_ENV (extra VT_* settings for vtllm,
# e.g. "VT_CPU_NUMERICS=fast"; the run's name gets it as a suffix via VT_TAG), NUM_PROMPTS
# (measured requests per C; default 16 at C=1, else max(32, 4C); a long run, e.g. 512, shows
# whether a server's RSS climbs as distinct prompts pass through it), MAX_MODEL_LEN (context
# per slot for both servers, 4096). On a GPU: MODEL (what vtllm serves; default its default
# GGUF), PEER_MODEL (llama-server's file; default MODEL; a GGUF copy of an HF checkpoint comes
# from `vtllm synth --gguf` or vtllm.models.gguf_writer), VT_ARGS (e.g. "--device cuda"),
# PEER_ARGS (e.g. "-ngl 99"), PY (the python that runs vtllm; default .venv/bin/python).
# HF_MODEL=DIR adds HF transformers (hf_server.py, static batches of C, HF_ARGS such as
# "--device cuda") as a third server on that checkpoint, run name "hf"; PY must have torch.
# Afterwards: python loadtest/peers/compare_table.py $OUT prints the table with ratios, and
# each server's peak RSS (VmHWM, saved as $OUT/<run>_c<C>.rss) where those files exist, and how
# vtllm's step loop spent each run (its /metrics read before and after, $OUT/<run>_c<C>.metrics).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba_cache}  # vtllm's compiled kernels
LLAMA_SERVER=${LLAMA_SERVER:-.peers-build/build/bin/llama-server}
THREADS=${THREADS:-2}
CONCURRENCY=${CONCURRENCY:-1 4 16}
OUT=${OUT:-/tmp/compare_servers}
VT_ENV=${VT_ENV:-}
VT_TAG=${VT_TAG:-vtllm}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}
PORT_VT=${PORT_VT:-8091}
PORT_LL=${PORT_LL:-8092}
PORT_HF=${PORT_HF:-8093}
HF_MODEL=${HF_MODEL:-}
HF_ARGS=${HF_ARGS:-}
[ -n "${SKIP_PEER:-}" ] || [ -x "$LLAMA_SERVER" ] ||
  { echo "compare_servers: no $LLAMA_SERVER (make peer-llama-server)" >&2; exit 2; }
# The file vtllm serves by default, passed explicitly to both servers.
MODEL=${MODEL:-$($PY -c 'from vtllm.models.default_model import default_model_path as p; print(p())')}
PEER_MODEL=${PEER_MODEL:-$MODEL}
VT_ARGS=${VT_ARGS:-}
PEER_ARGS=${PEER_ARGS:-}
mkdir -p "$OUT"

# Completions with token-id prompts: both servers get the very same ids (same seed), no chat
# template or tokenizer round trip in between, and usage.prompt_tokens is checked against them.
# Greedy (temperature 0) so neither server's default sampler chain is part of the comparison;
# ignore_eos fixes every output at 64 tokens, checked against usage and finish_reason=length.
# A connection per request for both: llama-server closes a connection after each stream while
# announcing keep-alive, so a reused one fails now and then ("disconnected without a response").
BENCH=(--endpoint completions --input-len 128 --output-len 64 --ignore-eos --temperature 0
       --token-count usage --seed 1 --no-keepalive)

wait_ready() {  # url pid
  for _ in $(seq 1200); do
    curl -sf "$1/health" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}

bench() {  # name url concurrency [bench_serve flags]
  local name=$1 url=$2 c=$3 n
  shift 3
  n=${NUM_PROMPTS:-$(( c == 1 ? 16 : 4 * c < 32 ? 32 : 4 * c ))}
  echo "== $name c=$c ($n prompts, $(uptime | sed 's/.*load/load/'))"
  $PY loadtest/bench_serve.py --base-url "$url" "${BENCH[@]}" "$@" --num-prompts "$n" \
    --warmup "$(( c < 2 ? 2 : c ))" --max-concurrency "$c" --save-json "$OUT/${name}_c$c.json" \
    > "$OUT/${name}_c$c.txt" 2>&1 || echo "   $name c=$c: bench_serve exit $? (see $OUT/${name}_c$c.txt)"
  grep -E "Successful|Failed|failed:|Output token|Median TTFT|P99 TTFT|Median TPOT" \
    "$OUT/${name}_c$c.txt" | sed 's/^/   /' || true
}

# vtllm's /metrics (compare_table.py's step-loop table).
snapshot() { curl -sf "$1/metrics" > "$2" || true; }  # url file

stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# Peak RSS (VmHWM, kB) of a server over its whole life, read just before it is stopped.
peak_rss() {  # pid name concurrency
  awk '/^VmHWM:/ {print $2}' "/proc/$1/status" > "$OUT/${2}_c$3.rss" 2>/dev/null || true
}

{
  echo "date: $(date -u +%FT%TZ)"; echo "host: $(uname -srm), $(nproc) cpus"
  grep -m1 "model name" /proc/cpuinfo; echo "model: $MODEL (peer: $PEER_MODEL)"
  echo "threads: $THREADS"; echo "vtllm args: $VT_ARGS"; echo "peer args: $PEER_ARGS"
  echo "vtllm: $(git rev-parse --short HEAD 2>/dev/null)" \
    "(+$(git status --porcelain 2>/dev/null | wc -l) changed files) $VT_ENV"
  [ -n "${SKIP_PEER:-}" ] || echo "llama-server: $("$LLAMA_SERVER" --version 2>&1 | tr '\n' ' ')"
} > "$OUT/${VT_TAG}_env.txt"

for c in $CONCURRENCY; do
  env $VT_ENV $PY -m vtllm serve --model "$MODEL" --port "$PORT_VT" --cpu-threads "$THREADS" \
    --max-num-seqs "$c" --max-model-len "$MAX_MODEL_LEN" --log-level warning $VT_ARGS \
    > "$OUT/${VT_TAG}_c$c.log" 2>&1 &
  pid=$!
  if wait_ready "http://127.0.0.1:$PORT_VT" $pid; then
    snapshot "http://127.0.0.1:$PORT_VT" "$OUT/${VT_TAG}_c$c.metrics.before"
    bench "$VT_TAG" "http://127.0.0.1:$PORT_VT" "$c"
    snapshot "http://127.0.0.1:$PORT_VT" "$OUT/${VT_TAG}_c$c.metrics"
  else echo "vtllm did not start (see $OUT/${VT_TAG}_c$c.log)" >&2; fi
  peak_rss $pid "$VT_TAG" "$c"
  stop $pid

  if [ -z "${SKIP_PEER:-}" ]; then
    "$LLAMA_SERVER" -m "$PEER_MODEL" --host 127.0.0.1 --port "$PORT_LL" -t "$THREADS" \
      -tb "$THREADS" --parallel "$c" --ctx-size $(( MAX_MODEL_LEN * c )) --cont-batching \
      --no-webui $PEER_ARGS > "$OUT/llamacpp_c$c.log" 2>&1 &
    pid=$!
    # llama-server puts the usage on the finish_reason chunk of /v1/completions streams (not
    # on a chunk of its own); bench_serve accepts that only when told, and only the peer is.
    if wait_ready "http://127.0.0.1:$PORT_LL" $pid; then
      bench llamacpp "http://127.0.0.1:$PORT_LL" "$c" --usage-with-finish
    else echo "llama-server did not start (see $OUT/llamacpp_c$c.log)" >&2; fi
    peak_rss $pid llamacpp "$c"
    stop $pid
  fi

  [ -z "$HF_MODEL" ] && continue
  $PY loadtest/peers/hf_server.py --model "$HF_MODEL" --port "$PORT_HF" --max-batch "$c" \
    $HF_ARGS > "$OUT/hf_c$c.log" 2>&1 &
  pid=$!
  if wait_ready "http://127.0.0.1:$PORT_HF" $pid; then bench hf "http://127.0.0.1:$PORT_HF" "$c"
  else echo "hf_server did not start (see $OUT/hf_c$c.log)" >&2; fi
  peak_rss $pid hf "$c"
  stop $pid
done
