#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` (C++, CPU only) as the HTTP serving peer for vtllm.
#
# Source: the llama.cpp tree vendored in the llama-cpp-python sdist on PyPI (PyPI is the one
# source reachable from the build machines), so the peer server runs the same llama.cpp as the
# `llamacpp_latency.py` peer. Output: $BUILD_DIR/build/bin/llama-server, a static binary.
#
#   bash loadtest/peers/build_llama_server.sh        # or: make peer-llama-server
#
# Environment: BUILD_DIR (default .peers-build, git-ignored), PIP (a pip to download the sdist
# with; default .venv/bin/pip), JOBS (default 2). About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=0.3.36
BUILD_DIR=${BUILD_DIR:-.peers-build}
PIP=${PIP:-.venv/bin/pip}
JOBS=${JOBS:-2}
SDIST="$BUILD_DIR/llama_cpp_python-$VERSION.tar.gz"
SRC="$BUILD_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"

mkdir -p "$BUILD_DIR"
if [ ! -f "$SDIST" ]; then
  "$PIP" download --no-binary :all: --no-deps \
    "llama-cpp-python==$VERSION" -d "$BUILD_DIR"
fi
[ -d "$SRC" ] || tar -xzf "$SDIST" -C "$BUILD_DIR"

# AMX off: -march=native (GGML_NATIVE) turns on AMX where the CPU reports it, llama.cpp then puts
# quantized weights in its AMX buffer type, and VMs that do not pass AMX through fault on the
# first tile instruction. gcc lets -mno-X win over -march, so every other native extension stays.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# No web UI (its assets come from npm or a download), no HTTPS, static libraries so the binary
# does not depend on the build tree's shared objects.
cmake -S "$SRC" -B "$BUILD_DIR/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DBUILD_SHARED_LIBS=OFF \
  -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build "$BUILD_DIR/build" --target llama-server -j "$JOBS"
"$BUILD_DIR/build/bin/llama-server" --version
