#!/usr/bin/env bash
# contrib/systemd: `systemd-analyze verify` is clean on the units, with
# ExecStart pointing at the built delta-apply and the man pages findable (as
# an installation has them). Usage: systemd_units.sh SRCDIR
set -euo pipefail
src=$1
analyze=$(command -v systemd-analyze || true)
if [ -z "$analyze" ]; then echo "skip: systemd-analyze is not installed (Debian: systemd)"; exit 77; fi
t=$(mktemp -d); trap 'rm -rf "$t"' EXIT
mkdir -p "$t/units" "$t/man/man1"
for f in "$src"/contrib/systemd/*.service "$src"/contrib/systemd/*.timer; do
  sed "s|/usr/local/bin/delta-apply|${HFDELTA_APPLY:?}|" "$f" > "$t/units/$(basename "$f")"
done
cp "$src"/man/*.1 "$t/man/man1/"
cd "$t/units"
if out=$(MANPATH="$t/man" "$analyze" verify ./*.timer ./*.service 2>&1) && [ -z "$out" ]; then
  echo "PASS systemd-analyze verify: $(ls | tr '\n' ' ')"
else
  echo "FAIL systemd-analyze verify:"; echo "$out"; exit 1
fi
