# The whole set-up on a fresh machine is `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint venv clean bench mcu-tools aarch64-tools browser-tools fuzz fuzz-sanitized

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/opfuse demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	if grep -q '^\[tool.importlinter\]' pyproject.toml; then $(VENV)/bin/lint-imports; fi

# The Cortex-M7 cross toolchain and emulator (Debian packages), installed only when missing and
# apt-get is there; otherwise a note, and the Cortex-M7 tests skip saying what is missing.
MCU_PACKAGES := gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

mcu-tools:
	@if command -v arm-none-eabi-gcc >/dev/null && command -v qemu-system-arm >/dev/null; then \
	  echo "mcu-tools: arm-none-eabi-gcc and qemu-system-arm found"; \
	elif command -v apt-get >/dev/null; then \
	  echo "mcu-tools: installing $(MCU_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(MCU_PACKAGES); \
	else \
	  echo "mcu-tools: no arm-none-eabi-gcc/qemu-system-arm and no apt-get: the Cortex-M7 tests will skip"; \
	fi

# The aarch64 cross compiler and user-mode emulator (Debian packages) that build and run the generated C
# with its NEON bodies (``opfuse run MODEL --target aarch64``, tests/codegen/test_neon.py), installed only
# when missing and apt-get is there; otherwise a note, and the aarch64 tests skip saying what is missing.
AARCH64_PACKAGES := gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user

aarch64-tools:
	@if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null; then \
	  echo "aarch64-tools: aarch64-linux-gnu-gcc and qemu-aarch64 found"; \
	elif command -v apt-get >/dev/null; then \
	  echo "aarch64-tools: installing $(AARCH64_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(AARCH64_PACKAGES); \
	else \
	  echo "aarch64-tools: no aarch64-linux-gnu-gcc/qemu-aarch64 and no apt-get: the aarch64 tests will skip"; \
	fi

# Headless Chromium (the HTML report's browser test) and Graphviz (the report's graph layout; the
# report falls back to its own SVG layout without it), installed only when missing and apt-get is
# there; otherwise a note, and the browser test skips saying what is missing.
BROWSER_PACKAGES := chromium graphviz

browser-tools:
	@if command -v chromium >/dev/null && command -v dot >/dev/null; then \
	  echo "browser-tools: chromium and dot found"; \
	elif command -v apt-get >/dev/null; then \
	  echo "browser-tools: installing $(BROWSER_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $(BROWSER_PACKAGES); \
	else \
	  echo "browser-tools: no chromium/dot and no apt-get: the HTML report's browser test will skip"; \
	fi

# The suite runs on every core (pytest-xdist, one worker per core; a test file stays on one worker so
# its module fixtures are built once). TEST_JOBS=0 runs it in this process, serially.
TEST_JOBS ?= auto

# Tests marked slow (`-m slow`: a second width or element type of a path, the larger zoo models under QEMU,
# 31 tests, 160 s of test time) are left out: with them the suite passed 20 minutes on CI's 2-core machine.
# `make test-slow` runs them too (the whole suite).
test: lint mcu-tools aarch64-tools browser-tools
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not slow"

test-slow: lint mcu-tools aarch64-tools browser-tools
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

# Not part of `make test`: the zoo through `opfuse bench` at 1 and 2 threads (about 6-10 minutes on
# 2 cores), written to benchmarks/results/bench_*.json and bench.md. Needs the bench extra (OpenVINO).
BENCH_STAMP := $(VENV)/.bench-installed
BENCH_REPEAT ?= 100

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) benchmarks/bench_zoo.py --repeat $(BENCH_REPEAT)

# Not part of `make test` (which runs a fixed-seed batch of 100 in tests/testing/test_fuzz.py): a
# long fuzz run, about 0.5 s a graph. Failures are shrunk and written to $(FUZZ_OUT); exit 1 if any.
FUZZ_COUNT ?= 2000
FUZZ_SEED ?= 0
FUZZ_OUT ?= fuzz-findings
FUZZ_JOBS ?= $(shell nproc 2>/dev/null || echo 1)

fuzz: $(STAMP)
	$(VENV)/bin/opfuse fuzz --count $(FUZZ_COUNT) --seed $(FUZZ_SEED) --jobs $(FUZZ_JOBS) --out $(FUZZ_OUT)

# The same run with every build under AddressSanitizer and UBSan: a read or write outside a tensor or
# undefined behaviour in the generated C ends its case as a crash naming it. The checking processes run
# under libasan (preloaded, with libstdc++, whose exception runtime ASan looks up); about 1 s a graph.
SANITIZED_CC ?= gcc -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all

fuzz-sanitized: $(STAMP)
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
	ASAN_OPTIONS=detect_leaks=0 CC="$(SANITIZED_CC)" \
	$(VENV)/bin/opfuse fuzz --count $(FUZZ_COUNT) --seed $(FUZZ_SEED) --jobs $(FUZZ_JOBS) --out $(FUZZ_OUT)

# Not part of `make test` (torch is an optional extra, so tests/torchmodels skip there): a BERT
# from a transformers config and a CNN with BatchNormalization kept, exported by PyTorch at opsets
# 13, 17 and the dynamo exporter's, compiled and run in C against onnxruntime (about 2 minutes).
TORCH_STAMP := $(VENV)/.torch-installed

$(TORCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,torch]'
	touch $(TORCH_STAMP)

.PHONY: test-torch
test-torch: $(TORCH_STAMP)
	$(PY) -m pytest -q -p no:logging tests/torchmodels

# Mutation testing (mutmut; [tool.mutmut] in pyproject.toml): the fusion rules, the memory planner
# and the code generator against the fast tests of those packages and the end-to-end ones. All of
# it is about 13,800 mutants (days on 2 cores); MUTANTS picks a part by mutmut's names, e.g.
# make mutate MUTANTS='opfuse.memory.arena.*'. Then `mutmut results` / `mutmut show NAME`.
MUTATE_STAMP := $(VENV)/.mutate-installed
MUTANTS ?=

.PHONY: mutate

$(MUTATE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,mutate]'
	touch $(MUTATE_STAMP)

mutate: $(MUTATE_STAMP)
	$(VENV)/bin/mutmut run $(MUTANTS)
	$(VENV)/bin/mutmut results

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache build src/*.egg-info mutants
