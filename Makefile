# Thin wrapper: install what is missing, configure, build, then run.
#   make demo                 local coordinator + workers training a small GPT
#   make test                 every test (unit + integration; CUDA tests skip without a GPU)
#   make test SANITIZE=address  unit tests under AddressSanitizer (separate build dir)
#   make bench                benchmarks (by hand; not part of test)
#   make fuzz [FUZZ_SECONDS=60] [FUZZ_TARGETS="job_spec ..."]  libFuzzer targets, clang build
BUILD_TYPE ?= RelWithDebInfo
SANITIZE ?=
BUILD ?= $(if $(SANITIZE),build-$(SANITIZE),build)
JOBS ?= $(shell nproc)
SHELL := /bin/bash
CMAKE_ARGS ?=

FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= job_spec checkpoint model_file token_file tokenizer coordinator

.PHONY: all deps configure build test demo bench fuzz clean format

all: build

deps:
	@deploy/install-deps.sh

configure: deps
	@set -o pipefail; cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DDROVER_SANITIZE=$(SANITIZE) $(CMAKE_ARGS) \
	  | { grep -vE "^-- (Found|Looking|Performing|Check|Detecting|The |Configuring|Generating|Build files)" || true; }

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@deploy/install-deps.sh test
	@cd $(BUILD) && ctest --output-on-failure -j 2 $(if $(SANITIZE),-L unit,)

demo: build
	@$(BUILD)/bin/drover demo

bench: build
	@cmake --build $(BUILD) -j $(JOBS) --target benchmarks
	@tests/bench/run_all.sh $(BUILD)

# Each target runs FUZZ_SECONDS on a copy of its seed corpus (the repo's stays small and
# hand-made); crashes land in $(FUZZ_BUILD)/fuzz/<target>/ and fail the run. The last
# line of each is libFuzzer's summary: executions, coverage (cov) and features (ft).
fuzz:
	@deploy/install-deps.sh fuzz
	@set -o pipefail; CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDROVER_FUZZ=ON \
	  | { grep -vE "^-- (Found|Looking|Performing|Check|Detecting|The |Configuring|Generating|Build files)" || true; }
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	@for t in $(FUZZ_TARGETS); do \
	  out=$(FUZZ_BUILD)/fuzz/$$t; mkdir -p $$out/corpus; cp -n tests/fuzz/corpus/$$t/* $$out/corpus/ 2>/dev/null; \
	  echo "== fuzz_$$t ($(FUZZ_SECONDS) s)"; \
	  $(FUZZ_BUILD)/bin/fuzz_$$t $$out/corpus -max_total_time=$(FUZZ_SECONDS) -max_len=65536 \
	    -rss_limit_mb=2048 -timeout=10 -artifact_prefix=$$out/ -print_final_stats=1 \
	    >$$out/log.txt 2>&1; rc=$$?; \
	  grep -E "^#[0-9]+.*(DONE|pulse|NEW)" $$out/log.txt | tail -1; \
	  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" $$out/log.txt; \
	  if [ $$rc -ne 0 ]; then echo "fuzz_$$t FAILED (rc $$rc): see $$out/log.txt"; grep -m3 -E "ERROR|==ABORT|Test unit written" $$out/log.txt; fail=1; fi; \
	done; exit $${fail:-0}

format:
	@git ls-files '*.cc' '*.h' '*.cu' | xargs clang-format -i

clean:
	rm -rf build build-*
