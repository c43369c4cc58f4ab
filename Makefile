# tensorwire: the two commands a new user needs are `make demo` and `make test`.
# Both install what is missing first (scripts/install-deps.sh), then build.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
BUILD := build
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
CMAKE_COMMON := -G Ninja -DPython_EXECUTABLE=$(abspath $(PY))

.PHONY: all deps build demo test test-cpp test-python test-sanitize test-tsan fuzz format format-check bench clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt | deps
	@cmake -S . -B $(BUILD) $(CMAKE_COMMON) -DTENSORWIRE_PYTHON=ON \
	  -Dnanobind_DIR=$$($(PY) -m nanobind --cmake_dir) >/dev/null

build: deps $(BUILD)/build.ninja
	@cmake --build $(BUILD) -j $(JOBS) | grep -v -E "^\[[0-9]+/[0-9]+\]" || true
	@test -x $(BUILD)/tools/tensorwire

demo: build
	@PYTHONPATH=python $(BUILD)/tools/tensorwire demo

test: build format-check test-cpp test-python test-sanitize fuzz
	@echo "make test: all suites passed"

test-cpp: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300

test-python: build
	@PYTHONPATH=python TENSORWIRE_BIN=$(abspath $(BUILD))/tools/tensorwire \
	  $(PY) -m pytest -q tests/python

# The C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
test-sanitize: deps
	@cmake -S . -B $(BUILD)-asan $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=Debug \
	  -DTENSORWIRE_SANITIZE=address,undefined -DTENSORWIRE_BENCH=OFF >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS) | grep -v -E "^\[[0-9]+/[0-9]+\]" || true
	@cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 600

# Concurrent code under ThreadSanitizer.
test-tsan: deps
	@cmake -S . -B $(BUILD)-tsan $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=Debug \
	  -DTENSORWIRE_SANITIZE=thread -DTENSORWIRE_BENCH=OFF >/dev/null
	@cmake --build $(BUILD)-tsan -j $(JOBS) | grep -v -E "^\[[0-9]+/[0-9]+\]" || true
	@cd $(BUILD)-tsan && ctest --output-on-failure -j $(JOBS) --timeout 600 -L concurrent

# libFuzzer on the decoder, under ASan/UBSan, for FUZZ_SECONDS; seeds from tests/fuzz/corpus.
fuzz: deps
	@cmake -S . -B $(BUILD)-fuzz $(CMAKE_COMMON) -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTENSORWIRE_FUZZ=ON -DTENSORWIRE_TESTS=OFF \
	  -DTENSORWIRE_TOOLS=OFF -DTENSORWIRE_BENCH=OFF >/dev/null
	@cmake --build $(BUILD)-fuzz -j $(JOBS) | grep -v -E "^\[[0-9]+/[0-9]+\]" || true
	@tests/fuzz/run.sh $(BUILD)-fuzz $(FUZZ_SECONDS)

FORMAT_FILES = $(shell git ls-files '*.h' '*.cpp')
format:
	@clang-format -i $(FORMAT_FILES)

format-check: deps
	@clang-format --dry-run -Werror $(FORMAT_FILES)

bench: build
	@PYTHONPATH=python $(PY) bench/run_all.py

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-fuzz python/tensorwire/_C*.so
