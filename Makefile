# Thin wrapper: install what is missing, configure, build, then run.
#   make demo                 local coordinator + workers training a small GPT
#   make test                 every test (unit + integration; CUDA tests skip without a GPU)
#   make test SANITIZE=address  unit tests under AddressSanitizer (separate build dir)
#   make bench                benchmarks (by hand; not part of test)
BUILD_TYPE ?= RelWithDebInfo
SANITIZE ?=
BUILD ?= $(if $(SANITIZE),build-$(SANITIZE),build)
JOBS ?= $(shell nproc)
SHELL := /bin/bash
CMAKE_ARGS ?=

.PHONY: all deps configure build test demo bench clean format

all: build

deps:
	@deploy/install-deps.sh

configure: deps
	@set -o pipefail; cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DDROVER_SANITIZE=$(SANITIZE) $(CMAKE_ARGS) \
	  | { grep -vE "^-- (Found|Looking|Performing|Check|Detecting|The |Configuring|Generating|Build files)" || true; }

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j 2 $(if $(SANITIZE),-L unit,)

demo: build
	@$(BUILD)/bin/drover demo

bench: build
	@cmake --build $(BUILD) -j $(JOBS) --target benchmarks
	@tests/bench/run_all.sh $(BUILD)

format:
	@git ls-files '*.cc' '*.h' '*.cu' | xargs clang-format -i

clean:
	rm -rf build build-*
