#!/usr/bin/env bash
# Builds everything with AddressSanitizer + UndefinedBehaviorSanitizer in
# build-asan/ and runs the whole test suite there (meson test).
#
# Usage: scripts/sanitize.sh [extra `meson test` arguments]
#
# Any sanitizer report fails the run. Every sanitized process aborts on its
# first report, so a command that the end-to-end tests start dies with exit
# code 134 (SIGABRT), which no test expects of it. AddressSanitizer reports
# (leaks included) also go to files under build-asan/sanitizer-logs/, and the
# script fails if any is there, whatever the tests made of the exit code.
# An empty log file is listed but does not fail the run, as it holds no report:
# the runtime creates its log file only when it starts to write one, so an
# empty file is left by a process SIGKILLed at that instant, and the crash and
# concurrency tests SIGKILL processes at arbitrary moments. (log_exe_name puts
# the program's name in each file name.)
# (GCC's UndefinedBehaviorSanitizer runtime, next to ASan, writes its reports
# to stderr whatever log_path says, so those show in the failing test's log.)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

builddir=build-asan
if [ -f "$builddir/build.ninja" ]; then
  meson setup --reconfigure "$builddir" >/dev/null
else
  meson setup "$builddir" -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized \
    -Dtests=enabled >/dev/null
fi
start=$(date +%s)
ninja -C "$builddir"
echo "sanitize: built in $(($(date +%s) - start)) s"

logs=$PWD/$builddir/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$logs/asan:log_exe_name=1"
# abort_on_error: without it a UBSan report exits with code 1, which is also
# the commands' own "failure" code and could pass for an expected outcome.
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1"

start=$(date +%s)
set +e
# Sanitized code runs several times slower: give each test more time.
meson test -C "$builddir" --print-errorlogs --timeout-multiplier 3 "$@"
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
