#!/usr/bin/env bash
# The main job on a generated example: installs the dependencies, builds the
# three commands it runs (delta-diff, delta-apply and the generator
# hfdelta-gen), generates a few saves of a bf16 training run, publishes a
# delta after each save, pulls them into a host-local copy, checks it is
# byte-identical to the last save, and prints a table.
#
# Environment: DEMO_DIR (work directory, default /tmp/hfdelta-demo),
# DEMO_PRESET (hfdelta-gen preset, default small), DEMO_SAVES (default 4),
# DEMO_LR (default 1e-6).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
builddir=${HFDELTA_BUILDDIR:-build}
t_demo=$SECONDS

cat <<EOF
hfdelta demo. The first time it takes about 2 minutes on an idle 2-core machine, nearly
all of it compiling (about 190 s of CPU: less with more cores, more on a busy machine);
seconds once built:
  1. the Debian packages it needs, if missing (scripts/setup.sh, as root or through sudo)
  2. building delta-diff, delta-apply and the save generator hfdelta-gen in $builddir/
  3. a few generated training saves, a delta published after each, pulled into a
     host-local copy, which is checked against the last save byte for byte; a table
EOF
echo
echo "== setup (scripts/setup.sh)"
scripts/setup.sh

# Only the three commands the demo runs. The build directory is test.sh's
# too (same options): its run builds the rest and rebuilds none of these.
targets=(src/delta-diff src/delta-apply tools/hfdelta-gen)
echo "== build: ${targets[*]} in $builddir"
t0=$SECONDS
if [ ! -f "$builddir/build.ninja" ]; then
  echo "[build] meson setup $builddir"
  meson setup "$builddir"
fi
echo "[build] ninja -C $builddir ${targets[*]}"
ninja -C "$builddir" "${targets[@]}"
echo "[build] done in $((SECONDS - t0)) s"
bin=$repo/$builddir/src

work=${DEMO_DIR:-/tmp/hfdelta-demo}
preset=${DEMO_PRESET:-small}
saves=${DEMO_SAVES:-4}
lr=${DEMO_LR:-1e-6}
rm -rf "$work"
mkdir -p "$work/root"

# Value of KEY in a flat JSON object (the commands print one per line).
jget() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" <<<"$2" | tr -d '"'; }

echo "== generating $saves saves (preset $preset, lr $lr) in $work/series"
"$repo/$builddir/tools/hfdelta-gen" --preset "$preset" --saves "$saves" --lr "$lr" "$work/series" 2>&1 | sed 's/^/   /'

echo "== host-local copy starts from the base checkpoint (version 0)"
"$bin/delta-apply" --init "$work/series/save_000" "$work/local" | sed 's/^/   /'

rows=()
for ((v = 1; v <= saves; v++)); do
  prev=$(printf 'save_%03d' $((v - 1)))
  cur=$(printf 'save_%03d' "$v")
  out="$work/root/$(printf 'weight_v%06d' "$v")"
  d=$("$bin/delta-diff" --json "$work/series/$prev" "$work/series/$cur" "$out")
  a=$("$bin/delta-apply" --json --root "$work/root" --target "$v" "$work/local")
  # The applied copy must equal the save byte for byte, every file.
  for f in "$work/series/$cur"/*; do
    cmp -s "$f" "$work/local/$(basename "$f")" || { echo "MISMATCH: $f"; exit 1; }
  done
  rows+=("$v $(jget density "$d") $(jget delta_bytes "$d") $(jget full_bytes "$d") $(jget seconds "$d") $(jget seconds "$a")")
done

echo "== every version applied; $work/local is byte-identical to save_$(printf '%03d' "$saves")"
echo
printf '%-8s %10s %14s %14s %9s %10s %10s\n' version density delta_bytes full_bytes ratio diff_s apply_s
for r in "${rows[@]}"; do
  read -r v dens db fb ds as <<<"$r"
  awk -v v="$v" -v dens="$dens" -v db="$db" -v fb="$fb" -v ds="$ds" -v as="$as" 'BEGIN {
    printf "%-8s %9.3f%% %14d %14d %8.2f%% %10.3f %10.3f\n", sprintf("%06d", v), 100 * dens, db, fb, 100 * db / fb, ds, as }'
done
echo
echo "state: $(cat "$work/local/.weight_sync/state.json")"
echo
echo "== done in $((SECONDS - t_demo)) s. The commands are in $repo/$builddir:"
echo "   src/delta-diff, src/delta-apply, tools/hfdelta-gen. To run them by name:"
echo "     export PATH=$repo/$builddir/src:$repo/$builddir/tools:\$PATH"
echo "   Next:"
echo "     delta-diff --inspect $work/root/weight_v000001    # what a version changes"
echo "     delta-apply --status $work/local                  # what the host-local copy holds"
echo "     the README's quickstart, top to bottom, on saves from hfdelta-gen or your own"
echo "     installing: README.md, Install (pip in a virtual environment, or meson install)"
echo "     scripts/test.sh --quick                           # the quick test suite (more to build first)"
