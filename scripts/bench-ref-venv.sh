#!/usr/bin/env bash
# scripts/bench-ref-venv.sh DIR: the reference side of bench/pipe/pipe_vs_tensordict.py.
# tensordict's TensorDictPipe runs on ucxx (ucxx-cu12, which pulls its own UCX and CUDA-side
# wheels but needs no GPU to run host-memory pipes). The project's .venv stays without it, so
# the reference gets a virtual environment of its own, made once and reused (`make bench`).
set -euo pipefail
dir=${1:?usage: scripts/bench-ref-venv.sh DIR}
python=${PYTHON:-python3}
if [[ -x $dir/bin/python ]] && "$dir/bin/python" -c "import ucxx, tensordict._ucxx" 2>/dev/null; then
  exit 0
fi
echo "bench-ref-venv: creating $dir with torch, tensordict and ucxx for the reference pipe"
rm -rf "$dir"
"$python" -m venv "$dir"
# torch pinned: the CPU build this project tests with (a newer one downloads gigabytes).
"$dir/bin/pip" install -q torch==2.13.0 tensordict==0.14.3 ucxx-cu12
"$dir/bin/python" -c "import ucxx, tensordict._ucxx"
