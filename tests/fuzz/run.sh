#!/usr/bin/env bash
# tests/fuzz/run.sh BUILD_DIR SECONDS: replays tests/fuzz/regressions/, then runs
# fuzz_decoder, fuzz_datapoint and fuzz_remote_frames for SECONDS each from their seeds. Prints one summary line; exits
# non-zero when libFuzzer reports a crash (the crashing input is then kept under
# BUILD_DIR/fuzz-artifacts/ for reproduction: BUILD_DIR/tests/fuzz/fuzz_decoder FILE).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
build=$1
seconds=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fuzzer=$build/tests/fuzz/fuzz_decoder
maker=$build/tests/fuzz/fuzz_make_corpus
for exe in "$fuzzer" "$maker"; do
  if [[ ! -x $exe ]]; then
    echo "fuzz: $exe not built (configure with -DTENSORWIRE_FUZZ=ON and clang)" >&2
    exit 2
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/tensorwire-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus" "$work/artifacts"
"$maker" "$work/corpus" "$work/remote_corpus"

# UBSan reports abort (libFuzzer then sees a crash) instead of printing and carrying on.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

keep_artifacts() {
  mkdir -p "$build/fuzz-artifacts"
  cp -f "$work"/artifacts/* "$build/fuzz-artifacts/" 2>/dev/null || true
}

# Ends the run of target fuzz_$1 (label "$2" in the messages): its log and artifacts decide.
report() {
  local crashes
  crashes=$(find "$work/artifacts" -type f | wc -l)
  if [[ $status -ne 0 || $crashes -ne 0 ]]; then
    grep -E -A 40 "ERROR: |==[0-9]+==|fuzz_$1 finding|runtime error" "$work/fuzz.log" | head -n 80 >&2 ||
      tail -n 60 "$work/fuzz.log" >&2
    keep_artifacts
    echo "fuzz: $2FAILED (libFuzzer exit $status, $crashes artifacts kept in $build/fuzz-artifacts): $3"
    exit 1
  fi
  echo "fuzz: $2ok: $3"
}

# Every input that once crashed must keep passing.
shopt -s nullglob
regressions=("$here"/regressions/*)
shopt -u nullglob
regressions_ok=0
for f in "${regressions[@]}"; do
  [[ $(basename "$f") == README* ]] && continue
  if ! "$fuzzer" "$f" >"$work/replay.log" 2>&1; then
    tail -n 40 "$work/replay.log" >&2
    echo "fuzz: FAILED: regression input $f crashes again" >&2
    exit 1
  fi
  regressions_ok=$((regressions_ok + 1))
done

status=0
"$fuzzer" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -timeout=10 -dict="$here/decoder.dict" -artifact_prefix="$work/artifacts/" \
  -print_final_stats=1 "$work/corpus" >"$work/fuzz.log" 2>&1 || status=$?

stat() { sed -n "s/^stat::$1: *//p" "$work/fuzz.log" | tail -n 1; }
last=$(grep -E '^#[0-9]+' "$work/fuzz.log" | tail -n 1 || true)
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
summary="$(stat number_of_executed_units) execs in ${seconds} s ($(stat average_exec_per_sec)/s),"
summary+=" cov ${cov:-?} ft ${ft:-?}, corpus ${corp:-?} inputs, peak rss $(stat peak_rss_mb) MB,"
summary+=" ${regressions_ok} regression inputs replayed"

report decoder "" "$summary"

# The datapoint decoder (wire/datapoint.h): SECONDS more from the checked-in seeds; its
# regressions are regressions/datapoint_*.
dp_fuzzer=$build/tests/fuzz/fuzz_datapoint
if [[ ! -x $dp_fuzzer ]]; then
  echo "fuzz: $dp_fuzzer not built" >&2
  exit 2
fi
shopt -s nullglob
for f in "$here"/regressions/datapoint_*; do
  if ! "$dp_fuzzer" "$f" >"$work/replay.log" 2>&1; then
    tail -n 40 "$work/replay.log" >&2
    echo "fuzz: FAILED: datapoint regression input $f crashes again" >&2
    exit 1
  fi
done
shopt -u nullglob
mkdir "$work/dp_corpus"
cp "$here"/datapoint_corpus/* "$work/dp_corpus/"
status=0
"$dp_fuzzer" -max_total_time="$seconds" -max_len=16384 -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -timeout=10 -dict="$here/decoder.dict" -artifact_prefix="$work/artifacts/" \
  -print_final_stats=1 "$work/dp_corpus" >"$work/fuzz.log" 2>&1 || status=$?
summary="$(stat number_of_executed_units) execs in ${seconds} s ($(stat average_exec_per_sec)/s)"
report datapoint "datapoint " "$summary"

# The remote inference transport's frames (wire/remote_frames.h): SECONDS more from the seeds
# fuzz_make_corpus wrote; its regressions are regressions/remote_*.
rf_fuzzer=$build/tests/fuzz/fuzz_remote_frames
if [[ ! -x $rf_fuzzer ]]; then
  echo "fuzz: $rf_fuzzer not built" >&2
  exit 2
fi
shopt -s nullglob
for f in "$here"/regressions/remote_*; do
  if ! "$rf_fuzzer" "$f" >"$work/replay.log" 2>&1; then
    tail -n 40 "$work/replay.log" >&2
    echo "fuzz: FAILED: remote frame regression input $f crashes again" >&2
    exit 1
  fi
done
shopt -u nullglob
status=0
"$rf_fuzzer" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -malloc_limit_mb=256 \
  -timeout=10 -dict="$here/decoder.dict" -artifact_prefix="$work/artifacts/" \
  -print_final_stats=1 "$work/remote_corpus" >"$work/fuzz.log" 2>&1 || status=$?
summary="$(stat number_of_executed_units) execs in ${seconds} s ($(stat average_exec_per_sec)/s)"
report remote_frames "remote frames " "$summary"
