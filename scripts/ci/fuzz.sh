#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ in build-san/ (scripts/ci/san-build.sh:
# clang, ASan + UBSan, the same library the sanitized test suite uses) and runs
# each one on a copy of its seed corpus (testdata/fuzz/). (`meson test` replays
# the seed corpora themselves in every build: the fuzz-replay-* tests.)
#
# Usage: scripts/ci/fuzz.sh [SECONDS]     fuzz each target for SECONDS (default 30)
#        scripts/ci/fuzz.sh --make-seeds  rewrite the seed corpora of testdata/fuzz/
#
# Targets run side by side, one process each, at most HFDELTA_FUZZ_JOBS at a
# time (default: the number of cores), so the eight targets of SECONDS each take
# about 4.5 * SECONDS on two cores. Inputs the fuzzer finds go to build-san/,
# never into testdata/. Exits non-zero if any target crashes, leaks, hits
# undefined behaviour, breaks an invariant, times out or runs out of memory;
# the input that did it is saved as build-san/fuzz-run/TARGET/crash-* (or
# leak-, timeout-, oom-) and replays with: build-san/tests/fuzz/fuzz_TARGET FILE
set -euo pipefail
cd "$(dirname "$0")/../.."

targets=(safetensors xor overwrite sparse index stack context parts)

mode=fuzz
seconds=30
case "${1:-}" in
  --make-seeds) mode=seeds ;;
  "") ;;
  *[!0-9]* | 0)
    echo "usage: scripts/ci/fuzz.sh [SECONDS] | --make-seeds" >&2
    exit 2
    ;;
  *) seconds=$1 ;;
esac

builddir=build-san

if [ "$mode" = seeds ]; then
  scripts/ci/san-build.sh tests/fuzz/make_fuzz_seeds
  for t in "${targets[@]}"; do rm -rf "testdata/fuzz/$t"; done
  "$builddir/tests/fuzz/make_fuzz_seeds" testdata/fuzz
  for t in "${targets[@]}"; do
    echo "fuzz: testdata/fuzz/$t: $(find "testdata/fuzz/$t" -type f | wc -l) seeds, $(cat "testdata/fuzz/$t"/* | wc -c) bytes"
  done
  exit 0
fi

scripts/ci/san-build.sh "${targets[@]/#/tests/fuzz/fuzz_}"

run="$builddir/fuzz-run"
rm -rf "$run"
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

# Runs one target; its log, artifacts and exit status stay in $run/TARGET/.
fuzz_one() {
  local t=$1 dir="$run/$1"
  mkdir -p "$dir/corpus"
  cp "testdata/fuzz/$t/"* "$dir/corpus/"
  local dict=()
  if [ -f "tests/fuzz/$t.dict" ]; then dict=("-dict=tests/fuzz/$t.dict"); fi
  local rc=0
  "$builddir/tests/fuzz/fuzz_$t" "${dict[@]}" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/" "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
  echo "$rc" >"$dir/rc"
}

jobs=${HFDELTA_FUZZ_JOBS:-$(nproc)}
echo "fuzz: ${#targets[@]} targets, ${seconds} s each, $jobs at a time"
start=$(date +%s)
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true
echo "fuzz: ran in $(($(date +%s) - start)) s"

final_stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }
failed=0
for t in "${targets[@]}"; do
  dir="$run/$t"
  rc=$(cat "$dir/rc" 2>/dev/null || echo "?")
  line="fuzz_$t: $(final_stat number_of_executed_units "$dir/log") runs, $(final_stat average_exec_per_sec "$dir/log") exec/s,"
  line+=" $(final_stat new_units_added "$dir/log") new inputs, peak rss $(final_stat peak_rss_mb "$dir/log") MB"
  if [ "$rc" = 0 ]; then
    echo "$line: ok"
  else
    failed=1
    echo "$line: FAILED (exit $rc)"
    grep -E 'ERROR: |SUMMARY: |invariant broken|runtime error' "$dir/log" | head -5 | sed 's/^/    /'
    for a in "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* "$dir"/slow-unit-*; do
      [ -e "$a" ] && echo "    input: $a (replay: $builddir/tests/fuzz/fuzz_$t $a)"
    done
    echo "    log: $dir/log"
  fi
done
exit $failed
