# tensorwire: the two commands a new user needs are `make demo` and `make test`.
# Both install what is missing first (scripts/install-deps.sh), then build.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
BUILD := build
JOBS ?= $(shell nproc)
# C++ tests ctest runs at once in build/ (make test-cpp): twice the CPUs. They mostly wait
# (for peer processes, sockets, timeouts): two at a time kept two CPUs 32-59% busy, and four
# took the suite from 73-75 s to 40-41 s (docs/benchmarks.md). Not under the sanitizers,
# whose tests use the CPUs: ASan's four at a time gained 18% and missed a 300 ms bound.
TEST_JOBS ?= $(shell echo $$(( 2 * $(JOBS) )))
# Per fuzz target (5 targets: `make fuzz` fuzzes for 5 x FUZZ_SECONDS).
FUZZ_SECONDS ?= 30
# ccache (scripts/install-deps.sh installs it) compiles each file once for build/ and the
# wheel: the wheel's build is configured like build/ (`wheel` below), in a folder as deep,
# ccache rewrites absolute paths under the repository (CCACHE_BASEDIR) relative to the
# build folder (hence the same depth) and leaves the folder's own path out of the hash
# (CCACHE_NOHASHDIR), so `make test` compiles the library three times (build/, ASan, TSan)
# and its core and wire layers a fourth (the fuzzers) instead of five times. `=`, not `:=`:
# looked up when a recipe runs, after `deps` has installed ccache.
LAUNCHERS = $(if $(shell command -v ccache),CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache)
CCACHE = $(addprefix -D,$(LAUNCHERS))
WHEEL_CCACHE = $(addprefix -C cmake.define.,$(LAUNCHERS))
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := true
DIST := dist
CMAKE_COMMON = -G Ninja -DPython_EXECUTABLE=$(abspath $(PY)) $(CCACHE)

.PHONY: all deps build demo docs typecheck test test-cpp test-python test-wheel wheel test-sanitize test-tsan fuzz chaos test-chaos format format-check bench clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt | deps
	@cmake -S . -B $(BUILD) $(CMAKE_COMMON) -DTENSORWIRE_PYTHON=ON -DTENSORWIRE_TESTS=ON -DTENSORWIRE_BENCH=ON \
	  -Dnanobind_DIR=$$($(PY) -m nanobind --cmake_dir) >/dev/null

build: deps $(BUILD)/build.ninja
	@cmake --build $(BUILD) -j $(JOBS) | grep -v -E "^\[[0-9]+/[0-9]+\]" || true
	@test -x $(BUILD)/tools/tensorwire
	@$(PY) scripts/editable-install.py

demo: build
	@PYTHONPATH=python $(BUILD)/tools/tensorwire demo

# The Python suite runs against the installed wheel (test-wheel), as a user gets the package;
# `make test-python` runs it against the source tree.
test: build format-check test-cpp test-wheel test-chaos typecheck docs test-sanitize test-tsan fuzz
	@echo "make test: all suites passed"

test-cpp: build
	@cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS) --timeout 300

test-python: build
	@PYTHONPATH=python TENSORWIRE_BIN=$(abspath $(BUILD))/tools/tensorwire \
	  $(PY) -m pytest -q tests/python

# A manylinux wheel and an sdist in dist/: scikit-build-core builds (build-wheel/, incremental),
# then scripts/repair-wheel.py bundles the native libraries (auditwheel) and UCX's modules.
# The compilers and -Werror of build/ (scikit-build-core would take Python's g++ and gcc
# names, and pyproject.toml turns -Werror off for other compilers): the same command lines,
# which ccache then answers from build/'s objects.
wheel: deps
	@rm -rf $(DIST) && mkdir -p $(DIST)/raw
	@set -o pipefail; CC=$${CC:-cc} CXX=$${CXX:-c++} CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) \
	  $(PY) -m build --no-isolation --sdist --wheel --outdir $(DIST)/raw \
	  -C cmake.define.TENSORWIRE_WERROR=ON $(WHEEL_CCACHE) . 2>&1 \
	  | { grep -v -E "^\[[0-9]+/[0-9]+\]|^\*|^-- " || true; }
	@ls $(DIST)/raw/tensorwire-*.whl $(DIST)/raw/tensorwire-*.tar.gz >/dev/null
	@$(PY) scripts/repair-wheel.py $(DIST)/raw/tensorwire-*.whl $(DIST)
	@mv $(DIST)/raw/tensorwire-*.tar.gz $(DIST)/ && rm -rf $(DIST)/raw

# The chaos soak (docs/reliability.md): the three systems under load on two simulated hosts
# while a seeded killer injects faults; CHAOS_SEED reproduces a run (random when empty).
CHAOS_SECONDS ?= 600
# CHAOS_ARGS: further options (tests/chaos/soak.py --help: --liveness, --slack, --kinds ...).
CHAOS_SEED ?=
CHAOS_ARGS ?=
chaos: build
	@PYTHONPATH=python $(PY) tests/chaos/soak.py --seconds $(CHAOS_SECONDS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) $(CHAOS_ARGS)

# make test's 60-second soak: a fixed seed, and bounds generous for a loaded 2-core CI
# machine (liveness 5 s, 10 s of slack on every bound, 90 s to recover).
test-chaos: build
	@PYTHONPATH=python $(PY) tests/chaos/soak.py --seconds 60 --seed 20261201 --liveness 5 \
	  --slack 10 --recover 90 --startup 180

# The wheel installed into a virtual environment of its own, and the Python suite run there.
test-wheel: build wheel
	@scripts/test-wheel.sh

# mypy on the Python examples and the drop-in modules, against the extension's stubs that
# `make build` generates (python/tensorwire/_C.pyi); what it checks: [tool.mypy] in pyproject.toml.
typecheck: build
	@$(VENV)/bin/mypy

# The documentation site in build/site, with the API reference from the docstrings and the
# extension's stubs (mkdocs.yml); --strict: a broken link or reference fails the build.
docs: build
	@$(VENV)/bin/mkdocs build --strict -q && echo "docs: build/site/index.html"

# The C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
# forked-child: tests that run code in a fork of the threaded test process. GCC 12's libasan
# does not take its allocator's locks around fork() (glibc's malloc does), so such a child
# can deadlock in its first malloc (gdb: it spins on __sanitizer::StackDepot's lock, held by
# another thread of the parent at the fork): they hung 2 of 567 in a CI run. They run in
# every other pass. (Runners fork replacements of dead workers from a single-threaded fork
# server, src/dataflow/fork_server.h, so those are safe here.)
# Without the tensorwire command (TOOLS=OFF), which no C++ test runs; the examples the tests
# run are built.
test-sanitize: deps
	@cmake -S . -B $(BUILD)-asan $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=Debug \
	  -DTENSORWIRE_SANITIZE=address,undefined -DTENSORWIRE_BENCH=OFF -DTENSORWIRE_TOOLS=OFF >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS) | grep -v -E "^\[[0-9]+/[0-9]+\]" || true
	@# fast_unwind_on_malloc=0: a leak's stack goes through libraries built without frame
	@# pointers (UCX), which the suppressions in tests/sanitize/lsan.supp must see.
	@cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 \
	  LSAN_OPTIONS=suppressions=$(abspath tests/sanitize/lsan.supp):print_suppressions=0 \
	  UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) --timeout 600 -LE forked-child

# Concurrent code (the tests labelled concurrent) under ThreadSanitizer; part of `make test`.
# Suppressions: tests/sanitize/tsan.supp, each saying why.
test-tsan: deps
	@cmake -S . -B $(BUILD)-tsan $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=Debug \
	  -DTENSORWIRE_SANITIZE=thread -DTENSORWIRE_BENCH=OFF -DTENSORWIRE_TOOLS=OFF >/dev/null
	@cmake --build $(BUILD)-tsan -j $(JOBS) | grep -v -E "^\[[0-9]+/[0-9]+\]" || true
	@# UCX's memory hooks crash TSan's allocator when a thread exits: tests run without them.
	@# forked-child: tests that run code in a fork of the threaded test process, where TSan's
	@# allocator (not fork-safe) can deadlock; they run in every other pass.
	@cd $(BUILD)-tsan && UCX_MEM_EVENTS=no TSAN_OPTIONS=suppressions=$(abspath tests/sanitize/tsan.supp) \
	  ctest --output-on-failure -j $(JOBS) --timeout 600 -L concurrent -LE forked-child

# libFuzzer under ASan/UBSan, FUZZ_SECONDS per target: the decoder, the datapoint format, the
# pipe handshake, the inference socket frames, the remote inference frames. Only the fuzzers
# and what they fuzz are built (the target `fuzzers`, tests/fuzz/CMakeLists.txt); seeds from
# fuzz_make_corpus and tests/fuzz,
# regressions replayed from tests/fuzz/regressions (tests/fuzz/run.sh).
fuzz: deps
	@cmake -S . -B $(BUILD)-fuzz $(CMAKE_COMMON) -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTENSORWIRE_FUZZ=ON -DTENSORWIRE_TESTS=OFF \
	  -DTENSORWIRE_TOOLS=OFF -DTENSORWIRE_BENCH=OFF >/dev/null
	@cmake --build $(BUILD)-fuzz -j $(JOBS) --target fuzzers | grep -v -E "^\[[0-9]+/[0-9]+\]" || true
	@tests/fuzz/run.sh $(BUILD)-fuzz $(FUZZ_SECONDS)

FORMAT_FILES = $(shell git ls-files '*.h' '*.cpp')
format:
	@clang-format -i $(FORMAT_FILES)

format-check: deps
	@clang-format --dry-run -Werror $(FORMAT_FILES)

bench: build
	@PYTHONPATH=python $(PY) bench/run_all.py

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-fuzz $(BUILD)-wheel $(BUILD)-wheel-venv $(DIST) python/tensorwire/_C*.so
