# bevy-gguf: `make demo` and `make test` each set everything up on a fresh machine.
#   make build   venv (.venv/), pinned llama.cpp source, stock + patched libllama, libbevy
#   make demo    build, generate the default model, run it with --parallel 8, then the A/B table
#   make test    build, then the test suite
#   make soak    build, then 20,000 requests at the server twice (25% and minimum cache; about 70 minutes, not in make test)
#   make gpu-bundle   what scripts/gpu_check.sh carries to a GPU machine (build/gpu-bundle)
#   make gpu-dry-run  the GPU check rehearsed on this CPU (rebuilds from the pruned source; not in make test)
# Knobs: JOBS=2 (compile jobs), CUDA=1 (ggml with CUDA), CUDA_ARCHS=90 (its architectures), PYTHON=python3.

PYTHON ?= python3
JOBS ?= 2
CUDA ?= 0
CUDA_ARCHS ?= 90
VENV := .venv
BIN := $(abspath $(VENV)/bin)
DEFAULT_MODEL := build/models/default.gguf
SOAK_MODEL := build/models/soak.gguf
SOAK_REQUESTS ?= 20000
export PATH := $(BIN):$(PATH)

.PHONY: venv build demo test soak lint clean gpu-bundle gpu-dry-run

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml LLAMA_CPP_PIN scripts/fetch_llama.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q cmake ninja
	CMAKE_ARGS="-DLLAMA_BUILD=OFF" $(BIN)/python -m pip install -q "$$($(BIN)/python scripts/fetch_llama.py --sdist-only)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

build: venv
	$(BIN)/python scripts/fetch_llama.py
	$(BIN)/cmake -S . -B build/cmake -G Ninja -DCMAKE_BUILD_TYPE=Release \
		-DBEVY_JOBS=$(JOBS) -DBEVY_CUDA=$(if $(filter 1,$(CUDA)),ON,OFF) -DBEVY_CUDA_ARCHS="$(CUDA_ARCHS)" \
		--log-level=WARNING
	$(BIN)/cmake --build build/cmake -j $(JOBS)

demo: build
	$(BIN)/bevy-gguf make-model $(DEFAULT_MODEL)
	$(BIN)/bevy-gguf run $(DEFAULT_MODEL) --parallel 8 --workload text --requests 8 --expert-cache 25%
	$(BIN)/bevy-gguf bench $(DEFAULT_MODEL) --requests 24 --prompt-tokens 128 --steps 64 \
		--systems llama-server,stock-resident,blocking,bevy --sweep cache=25%,90% --repeats 2 --out build/demo

test: build
	$(BIN)/python -m pytest -q tests

# what scripts/gpu_check.sh carries to a machine without a package registry
gpu-bundle: venv
	$(BIN)/python scripts/fetch_llama.py --make-pruned build/gpu-bundle/llama-pruned.tar.gz
	rm -rf build/gpu-bundle/wheels
	$(BIN)/python -m pip download -q --no-deps -d build/gpu-bundle/wheels $$($(BIN)/python -c \
		'import importlib.metadata as m; print(*(f"{p}=={m.version(p)}" for p in ("gguf", "diskcache")))')

gpu-dry-run: gpu-bundle
	JOBS=$(JOBS) scripts/gpu_check.sh --dry-run-cpu build/gpu-dry-run

soak: build
	$(BIN)/bevy-gguf make-model $(SOAK_MODEL) --layers 4 --experts 16 --top-k 2 --embd 64 --ff 64
	$(BIN)/bevy-gguf soak $(SOAK_MODEL) --requests $(SOAK_REQUESTS) --expert-cache 25% --out build/soak/25
	$(BIN)/bevy-gguf soak $(SOAK_MODEL) --requests $(SOAK_REQUESTS) --expert-cache min --link ram --out build/soak/min

lint: venv
	$(BIN)/ruff check bevy_gguf tests scripts

clean:
	rm -rf build $(VENV)
