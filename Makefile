# The two commands: `make serve` and `make test`. Both install what is missing first.
JOBS  ?= $(shell nproc)
BUILD ?= build
PY    := .venv/bin/python
MODEL ?= models/smollm2-135m-instruct-q4_1.gguf
FUZZ_SECONDS ?= 10

.PHONY: all setup build test fuzz soak serve chat bench eval fixtures image image-test clean

# Compiler cache (ccache, installed by setup) beside the other build caches (xgrammar, the
# reference results): a clean clone rebuilds only what changed since any earlier build on this
# machine. Paths under the checkout are hashed relative to it, so every clone shares it.
FATHOM_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/fathom
export CCACHE_DIR ?= $(FATHOM_CACHE)/ccache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1
export CCACHE_MAXSIZE ?= 4G
LAUNCHER := $(if $(shell command -v ccache),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

all: build

setup:
	@scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(LAUNCHER) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# The OpenAI-compatible server on the default model: HTTP on 127.0.0.1:8080, gRPC on 50051.
serve: build
	./$(BUILD)/fathom serve --config configs/default.json $(SERVE_ARGS)

# An interactive terminal chat on the default model.
chat: build
	./$(BUILD)/fathom chat --model $(MODEL)

# e2e: one pytest worker per core, each test file on one worker (its module-scoped servers start
# once): much of a test is waiting on a server or a client, so two workers on 2 cores took the 672
# tests from 393 s to 238 s.
test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)
	$(MAKE) --no-print-directory fuzz
	FATHOM_BUILD=$(BUILD) $(PY) -m pytest -q -n $(JOBS) --dist loadfile --durations=15 tests/e2e

# libFuzzer over every parser of outside bytes (GGUF, request bodies, chat templates +
# tokenizer), FUZZ_SECONDS each.
fuzz: setup
	@scripts/fuzz.sh $(FUZZ_SECONDS)

# Load and fault soak over loopback for SOAK_MINUTES (not part of `make test`):
# tests/soak/soak.py, writes bench/results/soak.md, fails on any lost request or leak.
SOAK_MINUTES ?= 3
soak: build
	FATHOM_BUILD=$(BUILD) $(PY) tests/soak/soak.py --minutes $(SOAK_MINUTES) --build $(BUILD)

# BENCH_ARGS passes options to bench/run_bench.py, e.g. the real model shapes on random weights:
# make bench BENCH_ARGS="--models llama-3.2-1b,llama-3.1-8b --threads 2"
bench: build
	@cmake --build $(BUILD) -j$(JOBS) --target benches
	FATHOM_BUILD=$(BUILD) $(PY) bench/run_bench.py $(BENCH_ARGS)

# A bounded long-context evaluation per attention policy (RULER-style tasks through the OpenAI API,
# sparse kernels at every length to judge each method; ~5 min on 2 cores): eval/results/ruler.md.
# EVAL_ARGS adds or overrides options (eval/ruler_eval.py --help).
eval: build
	$(PY) eval/ruler_eval.py --models smollm2,gemma3 --lengths 1024,4096 --trials 4 --min-keys 0 $(EVAL_ARGS)

# Regenerates tests/fixtures/ (tiny random-weight models as GGUF and transformers' reference logits)
# in its own environment: torch and transformers are not needed by `make test`.
FIXTURES_PY := .venv-fixtures/bin/python
fixtures: .venv-fixtures/.stamp
	$(FIXTURES_PY) scripts/make_fixtures.py

.venv-fixtures/.stamp: scripts/requirements-fixtures.txt
	@[ -x $(FIXTURES_PY) ] || python3 -m venv .venv-fixtures
	.venv-fixtures/bin/pip install -q --disable-pip-version-check -r scripts/requirements-fixtures.txt
	@touch $@

# The CPU container image fathom:cpu (docker/Dockerfile.cpu) built with podman on a Debian 12 base
# made by debootstrap (scripts/image.sh; ~25 min on 2 cores). tests/image/test_container_image.py
# smoke-tests it when it exists.
image:
	@scripts/image.sh

# The image's smoke test (tests/image/test_container_image.py; not in `make test`: the image is
# only as new as the last `make image`).
image-test: setup
	$(PY) -m pytest -q tests/image

clean:
	rm -rf $(BUILD) build-fuzz
