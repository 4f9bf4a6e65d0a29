#!/usr/bin/env bash
# llama.cpp built with CUDA for sm_90 (Hopper): the GPU peer of `python -m bench.gpu`
# (llama-bench, llama-batched-bench) and of the HTTP comparison (llama-server).
#
# Two steps, so that a GPU machine without network access can run the second:
#
#   bash loadtest/peers/build_llama_cuda.sh source   # where PyPI is reachable
#   bash loadtest/peers/build_llama_cuda.sh build    # on the GPU machine (nvcc, cmake, ninja)
#
# `source` takes the llama.cpp tree vendored in the llama-cpp-python sdist on PyPI (the same
# llama.cpp as the CPU peers, build_llama_server.sh) and packs what a CUDA build needs into
# $SRC_TAR (~10 MB: no docs, models, tests, examples or other GPU backends), small enough to
# travel with the working tree. `build` unpacks it and builds the three tools into
# $BUILD_DIR/build/bin, statically linked; then:
#
#   python -m bench.gpu --llama-bench $BUILD_DIR/build/bin/llama-bench
#
# Environment: SRC_TAR (default .peers-src/llama.cpp-cuda.tar.gz), BUILD_DIR (default
# .peers-build-cuda), PIP (for `source`; default .venv/bin/pip), JOBS (default: all cores),
# CUDA_ARCH (default 90).
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=0.3.36
SRC_TAR=${SRC_TAR:-.peers-src/llama.cpp-cuda.tar.gz}
BUILD_DIR=${BUILD_DIR:-.peers-build-cuda}
PIP=${PIP:-.venv/bin/pip}
JOBS=${JOBS:-$(nproc)}
CUDA_ARCH=${CUDA_ARCH:-90}

source_tree() {
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  "$PIP" download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$tmp" >/dev/null
  tar -xzf "$tmp/llama_cpp_python-$VERSION.tar.gz" -C "$tmp"
  local src="$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp"
  # Not needed to build llama-bench, llama-batched-bench and llama-server with CUDA.
  rm -rf "$src"/{docs,models,media,tests,benches,examples,pocs,conversion,gguf-py}
  for backend in "$src"/ggml/src/ggml-*/; do
    case "$(basename "$backend")" in ggml-cpu | ggml-cuda | ggml-blas) ;; *) rm -rf "$backend" ;; esac
  done
  mkdir -p "$(dirname "$SRC_TAR")"
  tar -czf "$SRC_TAR" -C "$(dirname "$src")" llama.cpp
  echo "$SRC_TAR: $(du -h "$SRC_TAR" | cut -f1)"
}

build() {
  [ -f "$SRC_TAR" ] || { echo "build_llama_cuda: $SRC_TAR is missing (run the source step)" >&2; exit 2; }
  command -v nvcc >/dev/null || { echo "build_llama_cuda: no nvcc on this machine" >&2; exit 2; }
  mkdir -p "$BUILD_DIR"
  [ -d "$BUILD_DIR/llama.cpp" ] || tar -xzf "$SRC_TAR" -C "$BUILD_DIR"
  # Static libraries: the binaries can be copied off the build tree. No web UI, no HTTPS.
  cmake -S "$BUILD_DIR/llama.cpp" -B "$BUILD_DIR/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
    -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$BUILD_DIR/build" -j "$JOBS" \
    --target llama-bench llama-batched-bench llama-server
  "$BUILD_DIR/build/bin/llama-bench" --help >/dev/null
  ls -la "$BUILD_DIR/build/bin"/llama-{bench,batched-bench,server}
}

case "${1:-}" in
  source) source_tree ;;
  build) build ;;
  *) echo "usage: build_llama_cuda.sh source|build" >&2; exit 2 ;;
esac
