#!/usr/bin/env bash
# Installs the dependencies, builds, and runs every check of the project:
#   1. meson test: doctest unit tests and end-to-end tests of the real binaries
#   2. interop: the real safetensors library and a slime-layout reference (scripts/ci/interop.sh --light)
#   3. python: the Python package installed, its wheel built, its pytest suite (scripts/ci/python-test.sh)
#   4. sanitizers: unit tests, fuzz replays and every end-to-end test (e2e-bounded aside) run against the
#      commands built with ASan + UBSan (scripts/ci/sanitize.sh)
#   5. fuzzing: each libFuzzer target for HFDELTA_FUZZ_SECONDS (default 30) (scripts/ci/fuzz.sh)
# Usage: scripts/test.sh [--quick] [extra `meson test` arguments]
#   --quick  only step 1, and of it only the quick suite (meson test --suite quick:
#            about a minute once built)
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
args=()
for a in "$@"; do
  if [ "$a" = --quick ]; then quick=1; else args+=("$a"); fi
done

# Twice as many tests at a time as cores: the end-to-end tests spend much of
# their time waiting on fsync and on the commands they start.
export MESON_TESTTHREADS=${MESON_TESTTHREADS:-$((2 * $(nproc)))}

echo "==== setup (scripts/setup.sh)"
t0=$SECONDS
scripts/setup.sh || exit 1
echo "==== setup: $((SECONDS - t0)) s"

builddir=${HFDELTA_BUILDDIR:-build}
echo
echo "==== build ($builddir)"
t0=$SECONDS
# ccache (scripts/setup.sh): meson puts it before the C and C++ compilers by
# itself, and here before nvcc too, so that the Python stage's build (the same
# sources, flags and relative paths) takes the objects of this one, the CUDA
# kernels above all, instead of compiling them a second time.
if command -v ccache >/dev/null && [ -z "${CUDACXX:-}" ] && command -v nvcc >/dev/null; then
  export CUDACXX="ccache $(command -v nvcc)"
  echo "[build] CUDACXX=$CUDACXX"
fi
if [ -f "$builddir/build.ninja" ]; then
  # Already configured (by an earlier run, or scripts/demo.sh): only what
  # changed is rebuilt. Meson's summary is shown only if it fails.
  echo "[build] meson setup --reconfigure $builddir"
  if ! out=$(meson setup --reconfigure "$builddir" 2>&1); then
    echo "$out"
    exit 1
  fi
else
  echo "[build] meson setup $builddir"
  meson setup "$builddir" || exit 1
fi
echo "[build] ninja -C $builddir"
ninja -C "$builddir" || exit 1
echo "==== build ($builddir): $((SECONDS - t0)) s"

names=()
results=()
durations=()
stage() {  # stage NAME COMMAND...: runs a step, remembers whether it passed
  local name=$1
  shift
  echo
  echo "==== $name"
  local start=$SECONDS
  "$@"
  local rc=$?
  local took=$((SECONDS - start))
  echo "==== $name: exit $rc, $((took / 60)) min $((took % 60)) s"
  names+=("$name")
  results+=("$rc")
  durations+=("$took")
}

if [ "$quick" -eq 1 ]; then
  stage "meson test --suite quick" meson test -C "$builddir" --print-errorlogs --suite quick "${args[@]}"
else
  # The crash sweeps fault every write step when run alone (`meson test
  # --suite crash`). Here, within CI's 45 minutes, every 3rd, from an offset
  # drawn anew for each run and printed, so that successive runs cover every
  # step; HFDELTA_CRASH_STRIDE=1 scripts/test.sh faults them all.
  crash_stride=${HFDELTA_CRASH_STRIDE:-3}
  crash_offset=${HFDELTA_CRASH_OFFSET:-$((RANDOM % crash_stride))}
  echo "[test] crash sweeps: every write step n with (n - 1) % $crash_stride == $crash_offset" \
    "(replay: HFDELTA_CRASH_STRIDE=$crash_stride HFDELTA_CRASH_OFFSET=$crash_offset scripts/test.sh)"
  stage "meson test (unit, e2e)" env HFDELTA_CRASH_STRIDE="$crash_stride" HFDELTA_CRASH_OFFSET="$crash_offset" \
    meson test -C "$builddir" --print-errorlogs "${args[@]}"
fi
log="$builddir/meson-logs/testlog.json"
meson_ok=$(grep -c '"result": "OK"' "$log" 2>/dev/null || true)
meson_bad=$(grep -Ec '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" 2>/dev/null || true)
if [ "$quick" -eq 0 ]; then
  stage "interop (safetensors library, slime layout)" scripts/ci/interop.sh --light
  stage "python package (pip install, wheel, pytest)" scripts/ci/python-test.sh
  stage "sanitizers (ASan + UBSan: units, e2e of the commands)" scripts/ci/sanitize.sh
  stage "fuzzing (libFuzzer, ${HFDELTA_FUZZ_SECONDS:-30} s per target)" scripts/ci/fuzz.sh "${HFDELTA_FUZZ_SECONDS:-30}"
fi

echo
echo "==== summary"
passed=0
failed=0
for i in "${!names[@]}"; do
  if [ "${results[$i]}" -eq 0 ]; then status=passed; passed=$((passed + 1)); else status="FAILED (exit ${results[$i]})"; failed=$((failed + 1)); fi
  printf '  %-50s %-20s %4d s\n' "${names[$i]}" "$status" "${durations[$i]}"
done
echo "  meson tests: $meson_ok passed, $meson_bad failed"
echo "  total wall time: $((SECONDS / 60)) min $((SECONDS % 60)) s"
echo "checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
