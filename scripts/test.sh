#!/usr/bin/env bash
# Installs the dependencies, builds, and runs the whole test suite (meson test).
# Usage: scripts/test.sh [extra `meson test` arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

builddir=${HFDELTA_BUILDDIR:-build}
if [ -f "$builddir/build.ninja" ]; then
  meson setup --reconfigure "$builddir" >/dev/null
else
  meson setup "$builddir"
fi
ninja -C "$builddir"

set +e
meson test -C "$builddir" --print-errorlogs "$@"
rc=$?
set -e

# One closing line in the plain "N passed, N failed" form, counted from
# meson's own log, so any CI reads the outcome the same way.
log="$builddir/meson-logs/testlog.json"
if [ -f "$log" ]; then
  passed=$(grep -c '"result": "OK"' "$log" || true)
  failed=$(grep -Ec '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log" || true)
  echo "meson: $passed passed, $failed failed"
fi
exit $rc
