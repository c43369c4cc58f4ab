#!/usr/bin/env bash
# Tests the wheel in dist/ as a user gets it (`make test-wheel`): installed into a virtual
# environment of its own, with the Python test suite (tests/python) and the wheel's own checks
# (tests/wheel) run against the installed package.
#
# The environment (build-wheel-venv/) has no system site packages and never sees python/:
# the tests run with `python -P` (no current directory on sys.path) and no PYTHONPATH, and
# tests/wheel checks that `tensorwire` is the installed copy. Its dependencies (the wheel's
# `test` extra: torch, tensordict, torchrl, tensorpack...) install once per machine, which
# takes a few minutes; the stamp records the wheel's requirements, so a changed extra
# rebuilds it. The wheel itself is reinstalled on every run.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${WHEEL_VENV:-build-wheel-venv}
PY=${PYTHON:-python3}
shopt -s nullglob
wheels=(dist/tensorwire-*-manylinux*.whl)
if ((${#wheels[@]} != 1)); then
  echo "test-wheel: expected one manylinux wheel in dist/ (make wheel), found ${#wheels[@]}" >&2
  exit 1
fi
WHEEL=${wheels[0]}

# torch==2.13.0: the CPU build this machine installs from a file (a newer torch downloads gigabytes).
DEPS=("torch==2.13.0" "$WHEEL[test]")
stamp="$VENV/.tensorwire-test-deps"
want=$("$PY" -c '
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    [meta] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
    print([l for l in z.read(meta).decode().splitlines() if l.startswith("Requires-Dist")])
' "$WHEEL" | sha1sum | cut -c1-16)
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "test-wheel: creating $VENV with the wheel's test dependencies (once per machine)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  # Byte-compiled at install: with PYTHONDONTWRITEBYTECODE set (it is on this machine), every
  # test process would otherwise compile torch and tensordict anew (15 s an import).
  "$VENV/bin/pip" install -q --disable-pip-version-check "${DEPS[@]}" 2>&1 | grep -v -E "^WARNING: Location .* is ignored" || true
  echo "$want" > "$stamp"
fi
echo "test-wheel: installing $WHEEL into $VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEEL" 2>&1 \
  | grep -v -E "^WARNING: Location .* is ignored" || true

# The tests' own helpers (pipe_peer, a C++ peer) come from the developer build, as in make test-python.
unset PYTHONPATH
export TENSORWIRE_BIN="$PWD/$VENV/bin/tensorwire"
"$VENV/bin/python" -P -m pytest -q -p no:cacheprovider tests/wheel tests/python "$@"
