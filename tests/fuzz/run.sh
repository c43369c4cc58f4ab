#!/usr/bin/env bash
# tests/fuzz/run.sh BUILD_DIR SECONDS: for each target (the decoder, the datapoint format,
# the pipe handshake, the inference socket frames, the remote inference frames), replays its regression inputs
# (tests/fuzz/regressions/, by file-name prefix), then fuzzes it for SECONDS from its seed
# corpus. Prints one summary line per target; exits non-zero when libFuzzer reports a
# crash (the crashing input is then kept under BUILD_DIR/fuzz-artifacts/ for reproduction:
# BUILD_DIR/tests/fuzz/fuzz_TARGET FILE).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
build=$1
seconds=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
maker=$build/tests/fuzz/fuzz_make_corpus
for exe in "$maker" "$build"/tests/fuzz/fuzz_{decoder,datapoint,handshake,socket_frame}; do
  if [[ ! -x $exe ]]; then
    echo "fuzz: $exe not built (configure with -DTENSORWIRE_FUZZ=ON and clang)" >&2
    exit 2
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/tensorwire-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/artifacts"

# UBSan reports abort (libFuzzer then sees a crash) instead of printing and carrying on.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

keep_artifacts() {
  mkdir -p "$build/fuzz-artifacts"
  cp -f "$work"/artifacts/* "$build/fuzz-artifacts/" 2>/dev/null || true
}

stat() { sed -n "s/^stat::$1: *//p" "$work/fuzz.log" | tail -n 1; }

# fuzz TARGET LABEL MAX_LEN DICT REGRESSION_GLOB: replays the regressions, fuzzes from
# $work/corpus_TARGET (filled by the caller) with dictionary DICT for SECONDS, reports.
fuzz() {
  local target=$1 label=$2 max_len=$3 dict=$4 glob=$5
  local fuzzer=$build/tests/fuzz/fuzz_$target replayed=0 status=0 f
  # Every input that once crashed must keep passing.
  shopt -s nullglob
  for f in $glob; do
    [[ $(basename "$f") == README* ]] && continue
    if ! "$fuzzer" "$f" >"$work/replay.log" 2>&1; then
      tail -n 40 "$work/replay.log" >&2
      echo "fuzz: FAILED: ${label}regression input $f crashes again" >&2
      exit 1
    fi
    replayed=$((replayed + 1))
  done
  shopt -u nullglob
  "$fuzzer" -max_total_time="$seconds" -max_len="$max_len" -rss_limit_mb=2048 \
    -malloc_limit_mb=256 -timeout=10 -dict="$dict" \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus_$target" \
    >"$work/fuzz.log" 2>&1 || status=$?
  local last cov ft corp summary crashes
  last=$(grep -E '^#[0-9]+' "$work/fuzz.log" | tail -n 1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  summary="$(stat number_of_executed_units) execs in ${seconds} s ($(stat average_exec_per_sec)/s),"
  summary+=" cov ${cov:-?} ft ${ft:-?}, corpus ${corp:-?} inputs, peak rss $(stat peak_rss_mb) MB,"
  summary+=" ${replayed} regression inputs replayed"
  crashes=$(find "$work/artifacts" -type f | wc -l)
  if [[ $status -ne 0 || $crashes -ne 0 ]]; then
    grep -E -A 40 "ERROR: |==[0-9]+==|fuzz_$target finding|runtime error" "$work/fuzz.log" |
      head -n 80 >&2 || tail -n 60 "$work/fuzz.log" >&2
    keep_artifacts
    echo "fuzz: ${label}FAILED (libFuzzer exit $status, $crashes artifacts kept in $build/fuzz-artifacts): $summary"
    exit 1
  fi
  echo "fuzz: ${label}ok: $summary"
}

# The decoder: seeds generated (valid messages of every kind); its regressions are the
# files without another target's prefix.
"$maker" "$work/corpus_decoder"
decoder_regressions=()
for f in "$here"/regressions/*; do
  case $(basename "$f") in datapoint_* | handshake_* | socket_* | remote_* | README*) ;; *) decoder_regressions+=("$f") ;; esac
done
fuzz decoder "" 65536 "$here/decoder.dict" "${decoder_regressions[*]:-}"

# The datapoint decoder (wire/datapoint.h): seeds checked in (metadata of real datapoints).
mkdir "$work/corpus_datapoint"
cp "$here"/datapoint_corpus/* "$work/corpus_datapoint/"
fuzz datapoint "datapoint " 16384 "$here/decoder.dict" "$here/regressions/datapoint_*"

# The pipe handshake (wire/handshake.h): seeds recorded from real handshakes.
"$maker" "$work/corpus_handshake" handshake
fuzz handshake "handshake " 16384 "$here/handshake.dict" "$here/regressions/handshake_*"

# The inference socket frames (wire/socket_frame.h): seeds of every frame kind; a request's
# body is a wire-codec message, so the decoder's words join the frame's.
"$maker" "$work/corpus_socket_frame" socket
cat "$here/decoder.dict" "$here/socket_frame.dict" >"$work/socket_frame.dict"
fuzz socket_frame "socket frame " 65536 "$work/socket_frame.dict" "$here/regressions/socket_*"

# The remote inference frames (wire/remote_frames.h, wire/control_frame.h): seeds of a request
# length followed by a control frame of every kind.
"$maker" "$work/corpus_remote_frames" remote
fuzz remote_frames "remote frames " 4096 "$here/decoder.dict" "$here/regressions/remote_*"
