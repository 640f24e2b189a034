#!/usr/bin/env bash
# Scale: diff and apply of a Qwen3-8B-shaped pair (hfdelta-gen --preset
# qwen3-8b: about 16.4 GB a bf16 save, in 5 GB weight files as save_pretrained
# writes them), cold (page cache dropped) and warm (run again at once), in
# every hfdelta encoding, against the floors the bench measures with parallel
# preads (hfdelta-bench readfloor): reading BASE+NEW, reading and hashing them,
# and rewriting LOCAL (read, hash as base and as result, write every page
# back). Records the peak RSS and RssAnon of every run. Two saves do not fit a
# page cache smaller than 33 GB, so "warm" is what the cache kept of the run
# before.
#
# Opt-in (never in CI, which lacks the disk): needs about 36 GB free under the
# work directory (checked first) and root, to drop the page cache.
# Disk: BASE and NEW while diffing; then NEW is removed (every apply is checked
# with delta-apply --verify, against NEW's checksums the delta carries) and
# LOCAL is made from BASE (delta-apply --init) before each apply.
#
# Usage: scripts/bench/scale.sh [OPTIONS]
#   --encodings "E ..."  default: every encoding delta-diff offers
#   --preset P           hfdelta-gen preset (default qwen3-8b; a smaller one tries the script out)
#   --work DIR           scratch directory (default BUILDDIR/scale-work; removed at the end)
#   --out FILE           Markdown results (default BUILDDIR/bench/scale.md; records beside it, .jsonl)
#   --keep               keep the scratch directory
# Environment: HFDELTA_BUILDDIR (default build).
# Exit: 0 done, 1 a tool failed or an apply did not verify, 2 usage, 77 cannot
# run here (not root, not enough disk; the reason is printed).
set -euo pipefail
{ # read to the end before running
cd "$(dirname "$0")/../.."
repo=$PWD
builddir=${HFDELTA_BUILDDIR:-build}
B=$repo/$builddir
encodings='' work='' out='' keep=0 preset=qwen3-8b
die() { echo "scale: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --encodings) encodings=$2; shift 2 ;;
    --preset) preset=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1" ;;
  esac
done
for b in src/delta-diff src/delta-apply tools/hfdelta-gen bench/hfdelta-bench; do
  [ -x "$B/$b" ] || die "$B/$b is not built (meson setup $builddir && ninja -C $builddir)"
done
[ -n "$encodings" ] || encodings=$("$B/src/delta-diff" --help | sed -n 's/.*--encoding TEXT:{\([^}]*\)}.*/\1/p' | tr ',' ' ')
work=${work:-$repo/$builddir/scale-work}
out=${out:-$repo/$builddir/bench/scale.md}
rec=${out%.md}.jsonl
t0=$SECONDS
log() { echo "[scale $((SECONDS - t0)) s] $*"; }

if [ "$(id -u)" -ne 0 ] || ! [ -w /proc/sys/vm/drop_caches ]; then
  echo "scale: skipped: dropping the page cache needs root (/proc/sys/vm/drop_caches)"
  exit 77
fi
mkdir -p "$work" "$(dirname "$out")"
work=$(cd "$work" && pwd)
need=$((36 * 1000 * 1000 * 1000))
[ "$preset" = qwen3-8b ] || need=$((4 * 1000 * 1000 * 1000))
avail=$(df -P -B1 "$work" | awk 'NR == 2 { print $4 }')
if [ "$avail" -lt "$need" ]; then
  echo "scale: skipped: $((avail / 1000000000)) GB free under $work, about $((need / 1000000000)) GB needed"
  exit 77
fi
cleanup() { [ "$keep" = 1 ] || rm -rf "$work"; }
trap cleanup EXIT
: >"$rec"

bench() { "$B/bench/hfdelta-bench" "$@"; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
# run LABELS... -- CMD...: one measured run, recorded with its labels.
run() {
  local labels=()
  while [ "$1" != -- ]; do labels+=(--label "$1"); shift; done
  shift
  bench run --time-v --interval-ms 50 --append "$rec" "${labels[@]}" -- "$@" >/dev/null
}
floor() {  # floor WHAT CACHE [readfloor options] DIR...
  local what=$1 cache=$2
  shift 2
  bench readfloor --repeat 1 --append "$rec" --label "what=$what" --label "cache=$cache" "$@" >/dev/null
}

log "machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), $avail bytes free under $work"
log "generating the pair (hfdelta-gen --preset $preset --saves 1 --max-shard-size 5GB)"
"$B/tools/hfdelta-gen" --preset "$preset" --saves 1 --max-shard-size 5GB --force "$work/series" >/dev/null
base=$work/series/save_000 new=$work/series/save_001
log "pair: $(du -sh "$base" | cut -f1) + $(du -sh "$new" | cut -f1)"

# Floors of BASE+NEW: the first pass after a drop is cold, the second warm.
drop
floor inputs cold+warm "$base" "$new"
drop
floor inputs_hashed cold+warm --hash "$base" "$new"
log "floors of BASE+NEW measured"

mkdir -p "$work/deltas"
for enc in $encodings; do
  d=$work/deltas/$enc/weight_v000001
  mkdir -p "$(dirname "$d")"
  for cache in cold warm; do
    rm -rf "$d"
    [ "$cache" = cold ] && drop
    run "op=diff" "encoding=$enc" "cache=$cache" -- \
      "$B/src/delta-diff" -q --no-sync --encoding "$enc" --delta-version 1 --base-version 0 "$base" "$new" "$d" ||
      { echo "scale: delta-diff --encoding $enc failed" >&2; exit 1; }
  done
  bench size "$d" --append "$rec" --label "op=size" --label "encoding=$enc" >/dev/null
  log "diff $enc: $(du -sh "$d" | cut -f1)"
done
rm -rf "$new"

local_dir=$work/local
init_local() {
  rm -rf "$local_dir"
  "$B/src/delta-apply" -q --no-sync --init "$base" "$local_dir"
  sync
}
init_local
drop
floor local_rewrite cold+warm --hash --write-back "$local_dir"
sync
log "rewrite floor of LOCAL measured"
for enc in $encodings; do
  for cache in cold warm; do
    init_local  # LOCAL's pages stay cached after this copy: warm
    [ "$cache" = cold ] && drop
    run "op=apply_nosync" "encoding=$enc" "cache=$cache" -- \
      "$B/src/delta-apply" -q --no-sync "$work/deltas/$enc/weight_v000001" "$local_dir" ||
      { echo "scale: delta-apply of the $enc delta failed" >&2; exit 1; }
    sync
  done
  "$B/src/delta-apply" -q --verify "$local_dir" ||
    { echo "scale: LOCAL after the $enc delta does not verify against NEW's checksums" >&2; exit 1; }
  log "apply $enc: verified"
done
init_local
drop
run "op=apply" "encoding=context" "cache=cold" -- "$B/src/delta-apply" -q "$work/deltas/context/weight_v000001" "$local_dir"
"$B/src/delta-apply" -q --verify "$local_dir"
log "flushing apply (context) measured; writing $out"

python3 - "$rec" "$out" "$(git -C "$repo" rev-parse --short HEAD)" "$(nproc)" "$preset" <<'EOF'
import json, sys
rec, out, commit, cores, preset = sys.argv[1:]
rows = [json.loads(l) for l in open(rec)]
floors = {r["what"]: r for r in rows if r.get("kind") == "readfloor"}
def fl(what):
    r = floors[what]
    return r["warm_pass_s"], r["seconds"][0], r["bytes"]
runs = {(r["op"], r["encoding"], r["cache"]): r for r in rows if r.get("kind") == "run"}
sizes = {r["encoding"]: r for r in rows if r.get("op") == "size"}
ic, iw, ib = fl("inputs")
hc, hw, _ = fl("inputs_hashed")
lc, lw, lb = fl("local_rewrite")
L = [f"# Scale: a {preset} pair (commit {commit}, {cores} cores)", "",
     f"BASE+NEW {ib / 1e9:.1f} GB, LOCAL {lb / 1e9:.1f} GB. Floors (parallel preads, hfdelta-bench readfloor):", "",
     "| floor | cold | warm |", "|---|---:|---:|",
     f"| read BASE+NEW | {ic:.2f} s ({ib / ic / 1e9:.2f} GB/s) | {iw:.2f} s |",
     f"| read and hash BASE+NEW | {hc:.2f} s | {hw:.2f} s |",
     f"| rewrite LOCAL (read, hash twice, write back) | {lc:.2f} s | {lw:.2f} s |", "",
     "| encoding | delta | diff cold | / read floor cold | diff warm | peak RssAnon / RSS diff | apply `--no-sync` cold | / rewrite floor cold | apply warm | peak RssAnon / RSS apply |",
     "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
mib = lambda k: k / 1024
for enc in sizes:
    dc, dw = runs[("diff", enc, "cold")], runs[("diff", enc, "warm")]
    ac, aw = runs[("apply_nosync", enc, "cold")], runs[("apply_nosync", enc, "warm")]
    L.append(f"| {enc} | {sizes[enc]['bytes'] / 1e6:.1f} MB | {dc['wall_s']:.2f} s | {dc['wall_s'] / ic:.2f}× | "
             f"{dw['wall_s']:.2f} s | {mib(max(dc['peak_rss_anon_kib'], dw['peak_rss_anon_kib'])):.0f} / "
             f"{mib(max(dc['peak_vm_rss_kib'], dw['peak_vm_rss_kib'])):.0f} MiB | {ac['wall_s']:.2f} s | "
             f"{ac['wall_s'] / lc:.2f}× | {aw['wall_s']:.2f} s | "
             f"{mib(max(ac['peak_rss_anon_kib'], aw['peak_rss_anon_kib'])):.0f} / "
             f"{mib(max(ac['peak_vm_rss_kib'], aw['peak_vm_rss_kib'])):.0f} MiB |")
f = runs.get(("apply", "context", "cold"))
if f:
    L += ["", f"Flushing apply (context, cold): {f['wall_s']:.1f} s, peak RssAnon {mib(f['peak_rss_anon_kib']):.0f} MiB, "
          f"RSS {mib(f['peak_vm_rss_kib']):.0f} MiB."]
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
EOF
log "done"
exit 0
}
