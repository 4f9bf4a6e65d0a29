#!/usr/bin/env bash
# The GPU benchmark with both peers: our runner against the card's roofline, HF transformers
# and llama.cpp on the same synthetic checkpoints, one table at the end (python -m bench.gpu).
# On a machine with an NVIDIA GPU, from the repo root:
#
#   bash bench/gpu.sh [python -m bench.gpu flags: --shapes qwen3-0.6b --json out.json ...]
#
# Flags given here come after the defaults below, so they win; --peers without llamacpp
# (--peers hf, --peers none) skips llama.cpp and its build. Needs, in the venv of PY:
#   the [cuda] extra                 pip install -e '.[cuda]'
#   torch and HF transformers        pip install -r loadtest/peers/requirements-hf.txt
# The first run builds llama.cpp with CUDA (loadtest/peers/build_llama_cuda.sh: its source
# from the llama-cpp-python sdist on PyPI, then nvcc, cmake and ninja; `pip install cmake
# ninja` puts the last two in the venv) unless LLAMA_BENCH names a llama-bench built already.
#
# Environment: PY (default .venv/bin/python), LLAMA_BENCH (default: the build's), and for the
# build BUILD_DIR (default .peers-build-cuda), SRC_TAR, CUDA_ARCH (default 90), JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
command -v "$PY" >/dev/null || { echo "bench/gpu.sh: no $PY (set PY to a python)" >&2; exit 2; }
PY=$(command -v "$PY")
venv_bin=$(cd "$(dirname "$PY")" && pwd)
export PATH="$venv_bin:$PATH"  # the venv's cmake and ninja, where installed there
export PIP=${PIP:-$venv_bin/pip} BUILD_DIR=${BUILD_DIR:-.peers-build-cuda}
export PYTHONUNBUFFERED=1
unset NUMBA_ENABLE_CUDASIM  # the real GPU, not numba's simulator

# The peers asked for: the last --peers given wins, as in bench.gpu's own parsing.
peers=hf,llamacpp
prev=
for arg in "$@"; do
  case "$arg" in --peers=*) peers=${arg#--peers=} ;; esac
  [ "$prev" = --peers ] && peers=$arg
  prev=$arg
done

PEERS=$peers "$PY" - <<'PY'
import os
import sys
from importlib.metadata import PackageNotFoundError, version

hf = "pip install -r loadtest/peers/requirements-hf.txt"
fixes = {"numba-cuda": "pip install -e '.[cuda]'", "cuda-python": "pip install -e '.[cuda]'"}
fixes["torch"] = hf  # the card's ceilings are measured with torch, whatever the peers
if "hf" in os.environ["PEERS"].split(","):
    fixes["transformers"] = hf
missing = {}
for dist, fix in fixes.items():
    try:
        version(dist)
    except PackageNotFoundError:
        missing.setdefault(fix, []).append(dist)
for fix, dists in missing.items():
    print(f"bench/gpu.sh: {', '.join(dists)} missing: {sys.executable} -m {fix}", file=sys.stderr)
if missing:
    sys.exit(2)
from numba import cuda

if not cuda.is_available():
    sys.exit("bench/gpu.sh: numba.cuda sees no GPU")
PY

llama=()
if [[ ",$peers," == *,llamacpp,* ]]; then
  LLAMA_BENCH=${LLAMA_BENCH:-$BUILD_DIR/build/bin/llama-bench}
  if [ ! -x "$LLAMA_BENCH" ]; then
    for tool in nvcc cmake ninja; do
      command -v "$tool" >/dev/null || {
        echo "bench/gpu.sh: building llama.cpp needs $tool (or set LLAMA_BENCH=PATH)" >&2
        exit 2
      }
    done
    export SRC_TAR=${SRC_TAR:-.peers-src/llama.cpp-cuda.tar.gz}
    [ -f "$SRC_TAR" ] || bash loadtest/peers/build_llama_cuda.sh source
    bash loadtest/peers/build_llama_cuda.sh build
    LLAMA_BENCH=$BUILD_DIR/build/bin/llama-bench
  fi
  llama=(--llama-bench "$LLAMA_BENCH")
fi

exec "$PY" -m bench.gpu ${llama[@]+"${llama[@]}"} --peers hf,llamacpp "$@"
