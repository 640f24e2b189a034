#!/usr/bin/env bash
# A new user's first ten minutes, timed: a fresh clone in a new directory, then
# the README's commands as written. Opt-in, not in CI (about 15 minutes on 2
# cores, most of it compiling; it downloads the Python package's build tools
# from PyPI). Writes only below a new temporary directory (kept with --keep).
#
#   1. git clone REPO (default: this clone's HEAD) into TMP/hfdelta
#   2. scripts/demo.sh in the clone (its saves in TMP/demo)
#   3. the README's install blocks (## Install), as written, from the clone:
#      `python3 -m venv ~/hfdelta && ~/hfdelta/bin/pip install .` with HOME=TMP/home,
#      then the meson install-only build (`meson install` into DESTDIR=TMP/destdir)
#   4. the README's first try (its first ```sh block) with ~/hfdelta/bin on PATH
#      (/tmp/hfdelta-try read as TMP/hfdelta-try), and hfdelta-gen --version from
#      both installs
#   5. scripts/test.sh --quick in the clone: everything built, the quick suite run
#      (--no-tests: not)
#
# A fresh Debian 12 is approached by a PATH of the system's directories only
# (/usr/bin/python3, no /usr/local: no nvcc; weed's directory last) and, with --no-ccache (the default;
# --ccache: keep it), CCACHE_DISABLE=1, so that nothing comes from earlier builds.
# The packages scripts/setup.sh lists must be installed (the demo runs it).
# Usage: scripts/lab/fresh-install.sh [--ccache] [--no-tests] [--keep] [REPO]
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
repo=$here
tests=1
keep=0
export CCACHE_DISABLE=1
for a in "$@"; do
  case "$a" in
    --ccache) unset CCACHE_DISABLE ;;
    --no-ccache) export CCACHE_DISABLE=1 ;;
    --no-tests) tests=0 ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) repo=$a ;;
  esac
done
# The system's directories first; SeaweedFS's weed (scripts/setup.sh would
# install it otherwise) found where it is, after them.
weed=$(command -v weed || true)
export PATH=/usr/sbin:/usr/bin:/sbin:/bin${weed:+:$(dirname "$weed")}
T=$(mktemp -d /tmp/hfdelta-fresh.XXXXXX)
if [ "$keep" = 0 ]; then trap 'rm -rf "$T"' EXIT; fi
clone=$T/hfdelta
log=$T/log
mkdir -p "$log" "$T/home"

# Wall time depends on what else the machine runs; CPU time (user + system,
# of every process the step waited for) much less: on an idle machine of
# N cores a build takes about CPU / N.
names=()
results=()
timings=()
step() {  # step NAME COMMAND...: runs it (output in TMP/log/NAME.log), times it
  local name=$1
  shift
  echo "---- $name"
  local TIMEFORMAT='%R %U %S'
  { time "$@" > "$log/$name.log" 2>&1; } 2> "$log/$name.time"
  local rc=$?
  local real user sys
  read -r real user sys < "$log/$name.time"
  local t
  t=$(awk -v r="$real" -v u="$user" -v s="$sys" -v n="$(nproc)" \
    'BEGIN { printf "%6.0f s wall %6.0f s CPU (%4.0f s on %d idle cores)", r, u + s, (u + s) / n, n }')
  echo "---- $name: exit $rc, $t"
  if [ "$rc" -ne 0 ]; then tail -30 "$log/$name.log" | sed 's/^/   | /'; fi
  names+=("$name")
  results+=("$rc")
  timings+=("$t")
  return "$rc"
}

# The ```bash blocks of the README's "## Install" section, one file each.
install_blocks() {
  awk -v dir="$T" '
    /^## / { inside = ($0 == "## Install") }
    inside && !c && /^```bash[ \t]*$/ { c = 1; n++; f = dir "/install" n ".sh"; printf "" > f; next }
    c && /^```/ { c = 0; close(f); next }
    c { print > f }
    END { print n + 0 }' "$clone/README.md"
}

# The README's first ```sh block: the first try on hfdelta-gen's saves.
first_try() {
  awk '!c && /^```sh[ \t]*$/ { c = 1; next } c && /^```/ { exit } c { print }' "$clone/README.md" |
    sed "s#/tmp/hfdelta-try#$T/hfdelta-try#g" > "$T/try.sh"
  (cd "$T" && HOME=$T/home PATH=$T/home/hfdelta/bin:$PATH bash -euo pipefail "$T/try.sh")
}

installed_versions() {
  "$T/home/hfdelta/bin/hfdelta-gen" --version &&
    "$T/home/hfdelta/bin/delta-diff" --version &&
    "$T/destdir/usr/local/bin/hfdelta-gen" --version &&
    "$T/destdir/usr/local/bin/delta-apply" --version &&
    HOME=$T/home "$T/home/hfdelta/bin/python" -c 'import hfdelta; print("hfdelta", hfdelta.__version__)'
}

echo "fresh install in $T (CCACHE_DISABLE=${CCACHE_DISABLE:-unset}, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
step clone git clone -q "$repo" "$clone" || exit 1
step demo env DEMO_DIR="$T/demo" "$clone/scripts/demo.sh"
grep -E '^\[build\] done in' "$log/demo.log" | sed 's/^/   demo /'
n=$(install_blocks)
[ "$n" -ge 2 ] || { echo "the README's Install section has $n \`\`\`bash blocks, expected 2 (pip, meson)"; exit 1; }
step pip-install env HOME="$T/home" bash -c "cd '$clone' && bash -euo pipefail '$T/install1.sh'"
step meson-install env HOME="$T/home" DESTDIR="$T/destdir" bash -c "cd '$clone' && bash -euo pipefail '$T/install2.sh'"
step first-try first_try
step versions installed_versions && sed 's/^/   /' "$log/versions.log"
if [ "$tests" = 1 ]; then
  step quick-tests "$clone/scripts/test.sh" --quick
  grep -E '^==== (build|meson test)' "$log/quick-tests.log" | sed 's/^/   /'
fi

echo
echo "==== summary ($(nproc) cores, load now $(cut -d' ' -f1-3 /proc/loadavg); logs in $log$([ "$keep" = 1 ] || echo ', removed on exit'))"
failed=0
for i in "${!names[@]}"; do
  [ "${results[$i]}" -eq 0 ] || failed=$((failed + 1))
  printf '  %-14s exit %-3s %s\n' "${names[$i]}" "${results[$i]}" "${timings[$i]}"
done
[ "$failed" -eq 0 ]
