#!/usr/bin/env bash
# contrib/systemd: `systemd-analyze verify` is clean on the units, with
# ExecStart pointing at the built delta-apply and the man pages findable (as
# an installation has them). The templates (NAME@.service, NAME@.timer) are
# verified as an instance, NAME@test; the template service's command line,
# as systemd hands it to /bin/sh, is run against an empty root and LOCAL,
# and then a root with a version: its metrics file (HFDELTA_METRICS) must
# appear, and a metrics directory that does not exist must not stop the pull.
# Last, the times of a stop during --then stay in the order the units state.
# Usage: systemd_units.sh SRCDIR
set -euo pipefail
src=$(cd "$1" && pwd)
analyze=$(command -v systemd-analyze || true)
if [ -z "$analyze" ]; then echo "skip: systemd-analyze is not installed (Debian: systemd)"; exit 77; fi
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
mkdir -p "$t/units" "$t/man/man1"
for f in "$src"/contrib/systemd/*.service "$src"/contrib/systemd/*.timer; do
  sed "s|/usr/local/bin/delta-apply|${HFDELTA_APPLY:?}|" "$f" > "$t/units/$(basename "$f")"
done
units=()
for f in "$t"/units/*; do
  case $f in
    *@.service|*@.timer) cp "$f" "${f/@./@test.}"; units+=("./$(basename "${f/@./@test.}")") ;;
    *) units+=("./$(basename "$f")") ;;
  esac
done
cp "$src"/man/*.1 "$t/man/man1/"
cd "$t/units"
if out=$(MANPATH="$t/man" "$analyze" verify "${units[@]}" 2>&1) && [ -z "$out" ]; then
  echo "PASS systemd-analyze verify: ${units[*]}"
else
  echo "FAIL systemd-analyze verify:"; echo "$out"; exit 1
fi

# The template's ExecStart: sh -c '...' with $$ a literal $, %% a literal % and %i the instance.
for tmpl in "$src"/contrib/systemd/*@.service; do
  cmd=$(sed -n "s/^ExecStart=\/bin\/sh -c '\(.*\)'$/\1/p" "$tmpl" | sed 's/\$\$/$/g; s/%i/test/g; s/%%/%/g')
  [ -n "$cmd" ] || { echo "FAIL $(basename "$tmpl"): no ExecStart=/bin/sh -c '...'"; exit 1; }
  mkdir -p "$t/run/root" "$t/run/local"
  base=(env -i PATH=/usr/bin:/bin "HFDELTA_BIN=$(dirname "$HFDELTA_APPLY")" HFDELTA_LOCK_TIMEOUT=60
        "HFDELTA_ROOT=$t/run/root" "HFDELTA_LOCAL=$t/run/local")
  rc=0; "${base[@]}" "HFDELTA_THEN=echo then-ran" HFDELTA_OPTS='--threads 2' /bin/sh -c "$cmd" >/dev/null 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { echo "FAIL $(basename "$tmpl"): ExecStart on an empty root: exit $rc, not 0"; exit 1; }
  rc=0; msg=$("${base[@]}" HFDELTA_ROOT= /bin/sh -c "$cmd" 2>&1) || rc=$?
  if [ "$rc" -eq 0 ] || [[ $msg != *'set in /etc/hfdelta/test.env'* ]]; then
    echo "FAIL $(basename "$tmpl"): HFDELTA_ROOT empty: exit $rc: $msg"; exit 1
  fi
  echo "PASS $(basename "$tmpl"): ExecStart runs delta-apply from HFDELTA_BIN; a missing HFDELTA_ROOT is named"

  # A version to pull, LOCAL initialised: the metrics file appears, complete.
  "${HFDELTA_GEN:?}" --preset tiny --saves 1 "$t/run/series" >/dev/null 2>&1
  rm -rf "$t/run/local" && "$HFDELTA_APPLY" -q --init "$t/run/series/save_000" "$t/run/local"
  "$(dirname "$HFDELTA_APPLY")/delta-diff" -q "$t/run/series/save_000" "$t/run/series/save_001" "$t/run/root"
  mkdir -p "$t/run/textfile"
  prom=$t/run/textfile/hfdelta-test.prom
  rc=0; "${base[@]}" "HFDELTA_METRICS=$prom" /bin/sh -c "$cmd" >/dev/null 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { echo "FAIL $(basename "$tmpl"): a pull with HFDELTA_METRICS: exit $rc"; exit 1; }
  if ! grep -qx "hfdelta_version_held{local=\"$t/run/local\"} 1" "$prom" 2>/dev/null \
     || ! grep -q '^hfdelta_last_exit_code{.*} 0$' "$prom" || ! grep -q '^# TYPE hfdelta_last_exit_code gauge$' "$prom"; then
    echo "FAIL $(basename "$tmpl"): $prom missing or wrong:"; cat "$prom" 2>&1; exit 1
  fi
  [ "$(ls -A "$t/run/textfile")" = hfdelta-test.prom ] || { echo "FAIL: left beside it: $(ls -A "$t/run/textfile")"; exit 1; }
  rc=0; msg=$("${base[@]}" "HFDELTA_METRICS=$t/run/none/x.prom" /bin/sh -c "$cmd" 2>&1) || rc=$?
  if [ "$rc" -ne 0 ] || [[ $msg != *"no metrics: $t/run/none/ does not exist"* ]] || [ -e "$t/run/none" ]; then
    echo "FAIL $(basename "$tmpl"): HFDELTA_METRICS in a missing directory: exit $rc: $msg"; exit 1
  fi
  echo "PASS $(basename "$tmpl"): the pull writes HFDELTA_METRICS; a missing metrics directory is said, the pull goes on"

  mkdir -p "$t/run/reports"
  rc=0; "${base[@]}" "HFDELTA_REPORTS=$t/run/reports" HFDELTA_OPTS='--host node1' /bin/sh -c "$cmd" >/dev/null 2>&1 || rc=$?
  if [ "$rc" -ne 0 ] || ! grep -q '"exit_code": 0' "$t/run/reports/node1.json" 2>/dev/null; then
    echo "FAIL $(basename "$tmpl"): HFDELTA_REPORTS set: exit $rc, no report $t/run/reports/node1.json"; exit 1
  fi
  echo "PASS $(basename "$tmpl"): HFDELTA_REPORTS gets a report"
done

# A stop during --then: reload-vllm.sh resumes its engine (one request of at
# most VLLM_TIMEOUT) within delta-apply's default --stop-grace, and that lies
# within each unit's TimeoutStopSec: the order the units' comment states.
# shellcheck disable=SC2016  # a sed pattern: the $ is literal
resume=$(sed -n 's/^t_short=\${VLLM_TIMEOUT:-\([0-9][0-9]*\)}$/\1/p' "$src/contrib/reload-vllm.sh")
grace=$("$HFDELTA_APPLY" --help | sed -n 's/^ *--stop-grace .*(default \([0-9][0-9]*\))$/\1/p')
for unit in "$src"/contrib/systemd/*.service; do
  stop=$(sed -n 's/^TimeoutStopSec=\([0-9][0-9]*\)min$/\1/p' "$unit")
  if [ -z "$resume" ] || [ -z "$grace" ] || [ -z "$stop" ] || ! [ "$resume" -lt "$grace" ] ||
     ! [ "$grace" -lt $((stop * 60)) ]; then
    echo "FAIL $(basename "$unit"): want VLLM_TIMEOUT < --stop-grace < TimeoutStopSec, have ${resume:-?} s, ${grace:-?} s, ${stop:-?} min"
    exit 1
  fi
  echo "PASS $(basename "$unit"): a stop during --then: resume ${resume} s < --stop-grace ${grace} s < TimeoutStopSec ${stop} min"
done
