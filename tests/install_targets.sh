#!/usr/bin/env bash
# The README's install-only build (meson setup -Dtests=disabled) builds only
# what `meson install` installs: the commands delta-diff, delta-apply and delta-fleet,
# their bash completions, hfdelta-gen, and the static libraries they link; nothing else (no tests,
# no benchmark, no CUDA path, no fuzz targets). And pyproject.toml's setup
# arguments leave out the same. Configures a scratch build directory (no
# compiling) and reads meson's introspection.
# Usage: install_targets.sh SOURCE_ROOT
set -euo pipefail
src=${1:?usage: install_targets.sh SOURCE_ROOT}
T=$(mktemp -d /tmp/hfdelta-install-targets.XXXXXX)
trap 'rm -rf "$T"' EXIT

check() {  # check NAME SETUP_ARGS...: configures, then compares the targets
  local name=$1
  shift
  if ! out=$(meson setup "$T/$name" "$src" "$@" 2>&1); then
    echo "FAIL $name: meson setup $* failed:"
    echo "$out" | tail -20
    exit 1
  fi
  meson introspect "$T/$name" --targets | python3 -c '
import json, sys
name, want_installed = sys.argv[1], set(sys.argv[2].split())
targets = json.load(sys.stdin)
installed = {t["name"] for t in targets if t["installed"]}
built = {t["name"] for t in targets if t.get("build_by_default", True)}
helpers = {"hfdelta", "hfdelta-cli"}  # the static libraries the installed programs link
ok = True
if installed != want_installed:
    print(f"FAIL {name}: installs {sorted(installed)}, expected {sorted(want_installed)}"); ok = False
extra = built - installed - helpers
if extra:
    print(f"FAIL {name}: builds {sorted(extra)} as well, which nothing installed needs"); ok = False
if not ok:
    sys.exit(1)
print(f"PASS {name}: builds {sorted(built)}, installs {sorted(installed)}")
' "$name" "$want"
}

want="delta-diff delta-apply delta-fleet hfdelta-gen delta-diff-completion delta-apply-completion delta-fleet-completion"
check readme -Dtests=disabled
# pyproject.toml's setup arguments, but -Dpython (it needs nanobind, which
# only pip's build environment has): the package's build holds the same
# programs, and its extension module besides.
setup=$(sed -n 's/^setup = \[\(.*\)\]/\1/p' "$src/pyproject.toml" | tr -d '"' | tr ',' ' ')
args=()
for a in $setup; do
  [ "$a" = -Dpython=enabled ] || args+=("$a")
done
[ ${#args[@]} -gt 0 ] || { echo "FAIL cannot read the setup arguments of pyproject.toml"; exit 1; }
check pyproject "${args[@]}"
