#!/usr/bin/env bash
# Runs the test suite with the commands and the library built with
# AddressSanitizer + UndefinedBehaviorSanitizer (clang, build-san/, by
# scripts/ci/san-build.sh, shared with scripts/ci/fuzz.sh):
#   - the unit tests, the sharded writer's tests and the fuzz corpus replays,
#     sanitized whole (build-san/);
#   - every end-to-end test (suite e2e) but e2e-bounded, the release build's
#     test program (build/) running build-san's delta-diff, delta-apply and delta-fleet
#     (HFDELTA_CLI_DIR): what is checked is the commands' code; the tests'
#     own work (copying, comparing and hashing trees) runs at full speed, and
#     build-san compiles no end-to-end test. e2e-bounded asserts memory
#     peaks, which a sanitized build cannot keep (shadow memory, quarantine);
#     the release run asserts them. object-store and reload-scripts are left
#     out: they drive storage gateways and engine scripts, not the commands'
#     code paths, which the other tests run.
# Needs the release build in build/ (scripts/test.sh makes it first; here it
# is configured and built if missing).
#
# Usage: scripts/ci/sanitize.sh [`meson test` arguments: end-to-end tests named run instead]
#
# The crash sweeps fault every HFDELTA_CRASH_STRIDE-th write step (default 10,
# for CI's 45 minutes) from a random offset HFDELTA_CRASH_OFFSET (printed; set
# it to replay a run), so that successive runs cover every step. The hostile
# sweeps (a bit flipped, a file truncated: about 3,500 tries, each running
# delta-diff --inspect and delta-apply) try one in HFDELTA_HOSTILE_STRIDE
# (default 3) from HFDELTA_HOSTILE_OFFSET in the same way. The release run
# tries every one.
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

release=${HFDELTA_BUILDDIR:-build}
san_targets=(src/delta-diff src/delta-apply src/delta-fleet tests/unit-tests tests/sharded-tests)
for t in safetensors xor overwrite sparse context index stack parts; do san_targets+=("tests/fuzz/replay_$t"); done
scripts/ci/san-build.sh "${san_targets[@]}"
builddir=build-san
if [ ! -f "$release/build.ninja" ]; then meson setup "$release" >/dev/null; fi
ninja -C "$release" >/dev/null

export HFDELTA_CRASH_STRIDE=${HFDELTA_CRASH_STRIDE:-10}
export HFDELTA_CRASH_OFFSET=${HFDELTA_CRASH_OFFSET:-$((RANDOM % HFDELTA_CRASH_STRIDE))}
echo "sanitize: crash sweeps fault every ${HFDELTA_CRASH_STRIDE}th write step from step $((HFDELTA_CRASH_OFFSET + 1))" \
  "(replay: HFDELTA_CRASH_STRIDE=$HFDELTA_CRASH_STRIDE HFDELTA_CRASH_OFFSET=$HFDELTA_CRASH_OFFSET scripts/ci/sanitize.sh)"
export HFDELTA_HOSTILE_STRIDE=${HFDELTA_HOSTILE_STRIDE:-3}
export HFDELTA_HOSTILE_OFFSET=${HFDELTA_HOSTILE_OFFSET:-$((RANDOM % HFDELTA_HOSTILE_STRIDE))}
echo "sanitize: hostile sweeps try the n-th flip and truncation with n % $HFDELTA_HOSTILE_STRIDE == $HFDELTA_HOSTILE_OFFSET" \
  "(replay: HFDELTA_HOSTILE_STRIDE=$HFDELTA_HOSTILE_STRIDE HFDELTA_HOSTILE_OFFSET=$HFDELTA_HOSTILE_OFFSET scripts/ci/sanitize.sh)"

logs=$PWD/$builddir/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$logs/asan:log_exe_name=1"
# abort_on_error: without it a UBSan report exits with code 1, which is also
# the commands' own "failure" code and could pass for an expected outcome.
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1:log_path=$logs/ubsan:log_exe_name=1"

units=(unit sharded)
for t in safetensors xor overwrite sparse context index stack parts; do units+=("fuzz-replay-$t"); done
e2e=()
if [ $# -eq 0 ]; then
  mapfile -t e2e < <(meson test -C "$release" --no-rebuild --list --suite e2e 2>/dev/null | sed -n 's|^.* / ||p' |
    grep -vxE 'e2e-bounded|object-store|reload-scripts')
  echo "sanitize: ${#units[@]} sanitized test programs, ${#e2e[@]} end-to-end tests of the sanitized commands" \
    "(e2e-bounded, object-store and reload-scripts left out)"
fi

start=$(date +%s)
set +e
# Sanitized code runs several times slower: give each test more time. The
# two runs go side by side, the unit tests being few and long.
meson test -C "$builddir" --no-rebuild --print-errorlogs --timeout-multiplier 3 "${units[@]}" \
  >"$logs/../unit-tests.log" 2>&1 &
units_pid=$!
HFDELTA_CLI_DIR=$PWD/$builddir/src meson test -C "$release" --no-rebuild --logbase sanitize --print-errorlogs \
  --timeout-multiplier 3 "${e2e[@]}" "$@"
rc=$?
wait "$units_pid"
units_rc=$?
echo "---- sanitized test programs ($builddir):"
cat "$builddir/unit-tests.log"
[ "$rc" -ne 0 ] || rc=$units_rc
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
