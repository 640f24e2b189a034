#!/usr/bin/env bash
# Builds everything with AddressSanitizer + UndefinedBehaviorSanitizer in
# build-san/ (scripts/ci/san-build.sh: clang, shared with scripts/ci/fuzz.sh) and
# runs the whole test suite there (meson test) but e2e-bounded: that one asserts
# memory peaks, which a sanitized build cannot keep (shadow memory, quarantine),
# and spends a sixth of the stage's time on inputs of a hundred megabytes to
# measure them; the release run asserts them.
#
# Usage: scripts/ci/sanitize.sh [`meson test` arguments: tests named run instead]
#
# The crash sweeps fault every HFDELTA_CRASH_STRIDE-th write step (default 10,
# for CI's 45 minutes now that the python stage runs torch) from a random
# offset HFDELTA_CRASH_OFFSET (printed; set it to replay a run), so that
# successive runs cover every step; the release run faults them all.
#
# Any sanitizer report fails the run. Every sanitized process aborts on its
# first report, so a command that the end-to-end tests start dies with exit
# code 134 (SIGABRT), which no test expects of it. AddressSanitizer reports
# (leaks included) also go to files under build-san/sanitizer-logs/, and the
# script fails if any is there, whatever the tests made of the exit code.
# An empty log file is listed but does not fail the run, as it holds no report:
# the runtime creates its log file only when it starts to write one, so an
# empty file is left by a process SIGKILLed at that instant, and the crash and
# concurrency tests SIGKILL processes at arbitrary moments. (log_exe_name puts
# the program's name in each file name.)
# UndefinedBehaviorSanitizer reports go to build-san/sanitizer-logs/ubsan.* in
# the same way.
set -euo pipefail
cd "$(dirname "$0")/../.."

scripts/ci/san-build.sh
builddir=build-san

export HFDELTA_CRASH_STRIDE=${HFDELTA_CRASH_STRIDE:-10}
export HFDELTA_CRASH_OFFSET=${HFDELTA_CRASH_OFFSET:-$((RANDOM % HFDELTA_CRASH_STRIDE))}
echo "sanitize: crash sweeps fault every ${HFDELTA_CRASH_STRIDE}th write step from step $((HFDELTA_CRASH_OFFSET + 1))" \
  "(replay: HFDELTA_CRASH_STRIDE=$HFDELTA_CRASH_STRIDE HFDELTA_CRASH_OFFSET=$HFDELTA_CRASH_OFFSET scripts/ci/sanitize.sh)"

logs=$PWD/$builddir/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$logs/asan:log_exe_name=1"
# abort_on_error: without it a UBSan report exits with code 1, which is also
# the commands' own "failure" code and could pass for an expected outcome.
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1:log_path=$logs/ubsan:log_exe_name=1"

tests=()
if [ $# -eq 0 ]; then
  mapfile -t tests < <(meson test -C "$builddir" --list 2>/dev/null | sed -n 's|^.* / ||p' | grep -vx e2e-bounded)
  echo "sanitize: ${#tests[@]} tests; e2e-bounded left out (memory peaks, asserted by the release run)"
fi

start=$(date +%s)
set +e
# Sanitized code runs several times slower: give each test more time.
meson test -C "$builddir" --print-errorlogs --timeout-multiplier 3 "${tests[@]}" "$@"
rc=$?
set -e
echo "sanitize: tests ran in $(($(date +%s) - start)) s"

reports=$(find "$logs" -type f -size +0 | sort)
empty=$(find "$logs" -type f -size 0 | sort)
if [ -n "$empty" ]; then
  echo "sanitize: empty sanitizer logs (no report: the process was killed before its first line):"
  for r in $empty; do echo "  $r"; done
fi
if [ -n "$reports" ]; then
  echo "sanitize: sanitizer reports:"
  for r in $reports; do
    echo "==== $r"
    cat "$r"
  done
  [ "$rc" -ne 0 ] || rc=1
fi
if [ "$rc" -eq 0 ]; then
  echo "sanitize: all tests passed, no sanitizer reports"
else
  echo "sanitize: FAILED (meson test exit $rc, $(echo "$reports" | grep -c . || true) sanitizer report files)"
fi
exit "$rc"
