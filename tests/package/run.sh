#!/usr/bin/env bash
# tests/package/run.sh BUILD_DIR [CMAKE_ARG...]: installs the tensorwire built in
# BUILD_DIR into a temporary prefix (cmake --install), builds the consumer project beside
# this script against it with find_package(tensorwire), and runs it. CMAKE_ARGs go to the
# consumer's configure (ctest passes the generator, compiler and build type). $CMAKE names
# the cmake to use (default: cmake on PATH). The temporary directory is removed on exit.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [CMAKE_ARG...]" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmake=${CMAKE:-cmake}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tensorwire-package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
log=$tmp/log

# Quiet unless a step fails; then its output is the test's output.
step() {
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "package: failed: $*" >&2
    exit 1
  fi
}

step "$cmake" --install "$build" --prefix "$prefix"
step "$cmake" -S "$here" -B "$tmp/consumer" "$@" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
# The package must come from this install, not from one elsewhere on the machine.
found=$(sed -n 's/^tensorwire_DIR:PATH=//p' "$tmp/consumer/CMakeCache.txt")
if [[ $found != "$prefix"/* ]]; then
  echo "package: find_package(tensorwire) found '$found', not the package in $prefix" >&2
  exit 1
fi
step "$cmake" --build "$tmp/consumer"
"$tmp/consumer/consumer"
