#!/usr/bin/env bash
# Benchmark: hfdelta against zstd --patch-from, xdelta3 and rsync batches on
# generated series of bf16 training saves, in one run on one machine.
#
# Installs what it needs (apt-get), builds, generates one series per learning
# rate with hfdelta-gen, and for each consecutive pair of saves measures:
# density, the order-0 entropy bound of the change, wire bytes, diff and apply
# wall time, peak RSS and peak RssAnon of every tool, and the read floor (one
# warm pass reading the inputs), beside the floors of checked work (reading
# and hashing BASE+NEW; reading LOCAL, hashing it twice and writing it back). With 2 saves or more, a series at the target
# lr also measures squash: the chain of its deltas against their squash and a
# direct diff (bytes), and a --root pull of the chain against applying the
# squash (wall, peak RSS). Results: OUT/results.md and OUT/results.json
# (every raw figure, plus the machine); OUT/raw/records.jsonl holds the raw
# records. Then publishing from the trainer's memory (hfdelta.Publisher, in
# the Python package installed into BUILDDIR/py-venv) against saving with the
# safetensors library and running delta-diff, and against delta-diff alone, on
# a pair at the target lr, side by side (scripts/bench/bench_publish.py; results in
# OUT/publish.md and OUT/publish.json, appended to results.md). A missed target
# is reported, not an error; the script fails only when a tool fails or an
# applied result is not byte-identical to NEW.
#
# Usage: scripts/bench/bench.sh [OPTIONS]
#   --preset P         hfdelta-gen preset: tiny, small, qwen3-0.6b (default qwen3-0.6b)
#   --saves N          saves after the initial one, per learning rate (default 3)
#   --lrs "A B C"      learning rates, one series each (default "1e-7 1e-6 1e-5")
#   --target-lr LR     learning rate whose median pair is marked and checked against the
#                      targets (default 1e-6; its series runs first)
#   --repeat N         runs of every timed command; the minimum is reported (default 2)
#   --peer-pairs M     pairs where the peers and the 1-thread runs are measured: all,
#                      median (median pair of each lr) or marked (the marked pair only);
#                      default: all, except marked for qwen3-0.6b
#   --mem-presets "P Q"  presets whose peak memory is compared (default "small qwen3-0.6b")
#   --steps-per-save N optimizer steps between saves (default 1)
#   --out DIR          results directory (default BUILDDIR/bench)
#   --work DIR         scratch directory for the series (default OUT/work; removed at the end)
#   --keep             keep the scratch directory
#   --sections "S ..." which parts to run: main squash mem publish kinds sharded (default all);
#                      sharded: ShardedPublisher with 1, 2 and 4 gloo ranks against gathering to
#                      rank 0 (Publisher, or a save and delta-diff), scripts/bench/sharded.py,
#                      in OUT/sharded.md; needs torch in the venv (installed there if missing)
#                      kinds: mixture of experts (qwen3-moe, experts apart against stacked),
#                      FP8 with block scales and LoRA adapters, scripts/bench/kinds.sh, in
#                      OUT/kinds.md
#                      scale (only when named: about 36 GB of disk and root): a Qwen3-8B-shaped
#                      pair, cold and warm, every encoding against the floors,
#                      scripts/bench/scale.sh, in OUT/scale.md
# Each option has an environment variable: BENCH_PRESET, BENCH_SAVES, BENCH_LRS,
# BENCH_TARGET_LR, BENCH_REPEAT, BENCH_PEER_PAIRS, BENCH_MEM_PRESETS,
# BENCH_STEPS_PER_SAVE, BENCH_OUT, BENCH_WORK, BENCH_KEEP=1, BENCH_SECTIONS; HFDELTA_BUILDDIR
# picks the build directory (default build).
#
# Quick run: scripts/bench/bench.sh --preset small --saves 2
# Publishing from memory alone: scripts/bench/bench.sh --sections publish
set -euo pipefail
{ # read to the end before running, so an edit to this file cannot change a run under way
cd "$(dirname "$0")/../.."
repo=$PWD
t_start=$(date +%s.%N)

preset=${BENCH_PRESET:-qwen3-0.6b}
saves=${BENCH_SAVES:-3}
lrs=${BENCH_LRS:-"1e-7 1e-6 1e-5"}
target_lr=${BENCH_TARGET_LR:-1e-6}
repeat=${BENCH_REPEAT:-2}
peer_pairs=${BENCH_PEER_PAIRS:-auto}
mem_presets=${BENCH_MEM_PRESETS:-"small qwen3-0.6b"}
steps=${BENCH_STEPS_PER_SAVE:-1}
out=${BENCH_OUT:-}
work=${BENCH_WORK:-}
keep=${BENCH_KEEP:-0}
sections=${BENCH_SECTIONS:-"main squash mem publish kinds sharded"}
builddir=${HFDELTA_BUILDDIR:-build}
interval_ms=5

die() { echo "bench: error: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
    --preset) preset=$2; shift 2 ;;
    --saves) saves=$2; shift 2 ;;
    --lrs) lrs=$2; shift 2 ;;
    --target-lr) target_lr=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --peer-pairs) peer_pairs=$2; shift 2 ;;
    --mem-presets) mem_presets=$2; shift 2 ;;
    --steps-per-save) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --sections) sections=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
for sct in $sections; do
  case $sct in main | squash | mem | publish | kinds | sharded | scale) ;; *) die "unknown section $sct (main squash mem publish kinds sharded scale)" ;; esac
done
want() { [[ " $sections " == *" $1 "* ]]; }
[[ $saves =~ ^[1-9][0-9]*$ ]] || die "--saves must be a positive integer"
[[ $repeat =~ ^[1-9][0-9]*$ ]] || die "--repeat must be a positive integer"
[ "$repeat" -ge 2 ] || echo "bench: warning: --repeat $repeat: timings from a single run" >&2
case $preset in tiny | small | qwen3-0.6b) ;; *) die "unknown preset $preset" ;; esac
if [ "$peer_pairs" = auto ]; then
  if [ "$preset" = qwen3-0.6b ]; then peer_pairs=marked; else peer_pairs=all; fi
fi
case $peer_pairs in all | median | marked) ;; *) die "--peer-pairs must be all, median or marked" ;; esac

# Approximate bytes of one save of a preset (bf16).
save_bytes() {
  case $1 in tiny) echo 2000000 ;; small) echo 116000000 ;; qwen3-0.6b) echo 1193000000 ;; *) die "unknown preset $1" ;; esac
}
for p in $mem_presets; do save_bytes "$p" >/dev/null; done

# ---- dependencies and build -------------------------------------------------

need=()
for p in xdelta3 rsync zstd time; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "== installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
scripts/setup.sh >/dev/null
[ -f "$builddir/build.ninja" ] || meson setup "$builddir" >/dev/null
ninja -C "$builddir" >/dev/null
out=${out:-$repo/$builddir/bench}
work=${work:-$out/work}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/raw" "$out/bin" "$work"
mkdir -p "$out/raw" "$out/bin" "$work"
work=$(cd "$work" && pwd)
# The run uses its own copy of the commands, so a rebuild while it runs
# changes nothing under way.
B=$out/bin
for b in src/delta-diff src/delta-apply tools/hfdelta-gen bench/hfdelta-bench; do
  [ -x "$repo/$builddir/$b" ] || die "$repo/$builddir/$b was not built"
  cp "$repo/$builddir/$b" "$B/"
done
rec=$out/raw/records.jsonl
: >"$rec"

# ---- disk space -------------------------------------------------------------
# A series holds saves+1 saves at once; LOCAL, the peers' outputs and rsync's
# copy and batch need about 5 more saves; the memory series 4 saves each.
sb=$(save_bytes "$preset")
need_bytes=$((sb * (saves + 6)))
for p in $mem_presets; do
  [ "$p" = "$preset" ] || need_bytes=$((need_bytes > $(save_bytes "$p") * 4 ? need_bytes : $(save_bytes "$p") * 4))
done
avail=$(df -P -B1 "$work" | awk 'NR == 2 { print $4 }')
echo "== disk: $((avail / 1000000)) MB free under $work, about $((need_bytes / 1000000)) MB needed at a time"
[ "$avail" -gt $((need_bytes + need_bytes / 5)) ] || die "not enough free disk space under $work"

# ---- helpers ------------------------------------------------------------------

bench() { "$B/hfdelta-bench" "$@"; }
# note KIND KEY=VALUE...: a record of labels.
note() {
  local kind=$1 a=()
  shift
  for kv in "$@"; do a+=(--label "$kv"); done
  bench note --kind "$kind" --append "$rec" "${a[@]}" >/dev/null
}
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "[$(elapsed "$t_start") s] $*"; }

# Labels of the pair being measured, set by the caller.
ctx=()
# measure TOOL MODE REP CMD...: one timed run, page cache warmed by the caller.
measure() {
  local tool=$1 mode=$2 rep=$3
  shift 3
  bench run --time-v --interval-ms "$interval_ms" --append "$rec" "${ctx[@]}" \
    --label "tool=$tool" --label "mode=$mode" --label "rep=$rep" -- "$@" >/dev/null ||
    die "$tool $mode failed: $*"
}
# settle PATH...: flush dirty pages from earlier steps, then read the inputs once.
settle() {
  sync
  bench warm "$@" >/dev/null
}
# same_tree WANT GOT: GOT has exactly WANT's files (ignoring .weight_sync), byte-identical.
same_tree() {
  local want=$1 got=$2 f
  diff <(cd "$want" && find . -type f | sort) \
    <(cd "$got" && find . -path ./.weight_sync -prune -o -type f -print | sort) >/dev/null ||
    die "$got does not hold the same files as $want"
  while IFS= read -r f; do
    cmp -s "$want/$f" "$got/$f" || die "$got/$f differs from $want/$f"
  done < <(cd "$want" && find . -type f)
}
# same_files WANT GOT FILE...: the named files are byte-identical.
same_files() {
  local want=$1 got=$2 f
  shift 2
  for f in "$@"; do cmp -s "$want/$f" "$got/$f" || die "$got/$f differs from $want/$f"; done
}
json_field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" <<<"$2" | tr -d '"'; }

# Encodings this build offers.
encodings=$("$B/delta-diff" --help | sed -n 's/.*--encoding TEXT:{\([^}]*\)}.*/\1/p' | tr ',' ' ')
[ -n "$encodings" ] || encodings="xor overwrite"

# Per-shard commands of the peers: sh -c SCRIPT sh BASE NEW|PATCHES OUT SHARD...
zstd_diff='set -e; b=$1; n=$2; o=$3; shift 3; for f; do zstd -q -f -3 --long=31 --patch-from="$b/$f" "$n/$f" -o "$o/$f.zst"; done'
zstd_apply='set -e; b=$1; p=$2; o=$3; shift 3; for f; do zstd -q -f -d --long=31 --patch-from="$b/$f" "$p/$f.zst" -o "$o/$f"; done'
xdelta_diff='set -e; b=$1; n=$2; o=$3; shift 3; for f; do xdelta3 -e -f -s "$b/$f" "$n/$f" "$o/$f.vcdiff"; done'
xdelta_apply='set -e; b=$1; p=$2; o=$3; shift 3; for f; do xdelta3 -d -f -s "$b/$f" "$p/$f.vcdiff" "$o/$f"; done'

# ---- record the setup ---------------------------------------------------------

commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$repo" diff --quiet HEAD 2>/dev/null || commit="$commit+changes"
ordered_lrs=()
for lr in $lrs; do [ "$lr" = "$target_lr" ] && ordered_lrs=("$lr" "${ordered_lrs[@]}") || ordered_lrs+=("$lr"); done
note config "preset=$preset" "saves=$saves" "lrs=$lrs" "target_lr=$target_lr" "repeat=$repeat" \
  "peer_pairs=$peer_pairs" "mem_presets=$mem_presets" "steps_per_save=$steps" "interval_ms=$interval_ms" \
  "encodings=$encodings" "work=$work" "commit=$commit" "started=$(date -Is)"
bench machine "$work" --append "$rec" >/dev/null
for p in zstd xdelta3 rsync time; do note version "tool=$p" "version=$(dpkg-query -W -f='${Version}' "$p")"; done
log "preset $preset, $saves saves per lr, lrs: ${ordered_lrs[*]}, encodings: $encodings, $repeat runs per timed step, peers at $peer_pairs pairs"

# ---- hfdelta on one pair --------------------------------------------------------

# hfdelta_pair BASE NEW DETAIL(0|1) CHECK_FLOOR(0|1)
hfdelta_pair() {
  local base=$1 new=$2 detail=$3 floor=$4 lc=$work/local enc d rep mode flags first=1
  for enc in $encodings; do
    d=$work/delta-$enc/weight_v000001
    mkdir -p "$work/delta-$enc"
    for ((rep = 1; rep <= repeat; rep++)); do
      rm -rf "$d"
      settle "$base" "$new"
      measure "hfdelta-$enc" diff "$rep" "$B/delta-diff" -q --encoding "$enc" --delta-version 1 --base-version 0 "$base" "$new" "$d"
    done
    if [ "$detail" = 1 ]; then
      # delta-diff takes only version names (weight_vNNNNNN) for OUT.
      mkdir -p "$work/delta-$enc-1t"
      for ((rep = 1; rep <= repeat; rep++)); do
        rm -rf "$work/delta-$enc-1t/weight_v000001"
        settle "$base" "$new"
        measure "hfdelta-$enc" diff_1t "$rep" "$B/delta-diff" -q --encoding "$enc" --threads 1 --delta-version 1 --base-version 0 "$base" "$new" "$work/delta-$enc-1t/weight_v000001"
      done
      rm -rf "$work/delta-$enc-1t"
    fi
    bench size "$d" --append "$rec" "${ctx[@]}" --label "tool=hfdelta-$enc" >/dev/null
    for mode in apply apply_nosync apply_nosync_1t; do
      case $mode in
        apply) flags=() ;;
        apply_nosync) flags=(--no-sync) ;;
        apply_nosync_1t) [ "$detail" = 1 ] || continue; flags=(--no-sync --threads 1) ;;
      esac
      for ((rep = 1; rep <= repeat; rep++)); do
        "$B/delta-apply" -q --init "$base" "$lc"
        if [ "$first" = 1 ] && [ "$floor" = 1 ]; then
          first=0
          settle "$lc"
          bench readfloor --repeat 3 "$lc" --append "$rec" "${ctx[@]}" --label what=local >/dev/null
          # What a checked in-place apply cannot go below: read, hash as base and result, write back.
          bench readfloor --repeat 3 --hash --write-back "$lc" --append "$rec" "${ctx[@]}" --label what=local_rewrite >/dev/null
        fi
        settle "$d" "$lc"
        measure "hfdelta-$enc" "$mode" "$rep" "$B/delta-apply" -q "${flags[@]}" "$d" "$lc"
        same_tree "$new" "$lc"
      done
    done
  done
  rm -rf "$work"/delta-* "$lc"
}

# ---- the peers on one pair ----------------------------------------------------------

peers_pair() {
  local base=$1 new=$2 rep p=$work/patch o=$work/rebuilt
  local shards=()
  mapfile -t shards < <(cd "$new" && ls -- *.safetensors)
  # zstd --patch-from, one patch per shard file.
  for tool in zstd xdelta3; do
    local dcmd acmd
    if [ "$tool" = zstd ]; then dcmd=$zstd_diff acmd=$zstd_apply; else dcmd=$xdelta_diff acmd=$xdelta_apply; fi
    for ((rep = 1; rep <= repeat; rep++)); do
      rm -rf "$p" && mkdir -p "$p"
      settle "$base" "$new"
      measure "$tool" diff "$rep" sh -c "$dcmd" sh "$base" "$new" "$p" "${shards[@]}"
    done
    bench size "$p" --append "$rec" "${ctx[@]}" --label "tool=$tool" >/dev/null
    for ((rep = 1; rep <= repeat; rep++)); do
      rm -rf "$o" && mkdir -p "$o"
      settle "$base" "$p"
      measure "$tool" apply "$rep" sh -c "$acmd" sh "$base" "$p" "$o" "${shards[@]}"
      same_files "$new" "$o" "${shards[@]}"
    done
    rm -rf "$p" "$o"
  done
  # rsync: the batch file is what travels; it is replayed onto a copy of BASE.
  local batch=$work/rsync.batch
  for ((rep = 1; rep <= repeat; rep++)); do
    rm -f "$batch" "$batch.sh"
    settle "$base" "$new"
    measure rsync diff "$rep" rsync -a -I --no-whole-file --only-write-batch="$batch" "$new/" "$base/"
  done
  bench size "$batch" --append "$rec" "${ctx[@]}" --label tool=rsync >/dev/null
  for ((rep = 1; rep <= repeat; rep++)); do
    rm -rf "$o" && cp -a "$base" "$o"
    settle "$o" "$batch"
    measure rsync apply "$rep" rsync -a -I --no-whole-file --read-batch="$batch" "$o/"
    same_tree "$new" "$o"
  done
  rm -rf "$o" "$batch" "$batch.sh"
}

# ---- main series: one per learning rate ----------------------------------------------

saven() { printf 'save_%03d' "$1"; }
want main || ordered_lrs=()
for lr in "${ordered_lrs[@]}"; do
  series=$work/series-$lr
  log "generating $((saves + 1)) saves, preset $preset, lr $lr"
  t0=$(date +%s.%N)
  "$B/hfdelta-gen" --preset "$preset" --saves "$saves" --lr "$lr" --steps-per-save "$steps" "$series" 2>&1 | sed 's/^/   /'
  note timing "what=generation, lr $lr" "seconds=$(elapsed "$t0")"

  # Bounds and densities first: they decide the median pair.
  dens=()
  for ((k = 1; k <= saves; k++)); do
    j=$(bench bound "$series/$(saven $((k - 1)))" "$series/$(saven "$k")" --append "$rec" \
      --label series=main --label "lr=$lr" --label "pair=$k")
    dens+=("$(json_field density "$j") $k")
  done
  median=$(printf '%s\n' "${dens[@]}" | sort -g -k1,1 -k2,2n | sed -n "$(((saves + 1) / 2))p" | cut -d' ' -f2)
  [ "$lr" = "$target_lr" ] && note marked "lr=$lr" "pair=$median"

  for ((k = 1; k <= saves; k++)); do
    base=$series/$(saven $((k - 1)))
    new=$series/$(saven "$k")
    detail=0
    case $peer_pairs in
      all) detail=1 ;;
      median) [ "$k" = "$median" ] && detail=1 ;;
      marked) [ "$k" = "$median" ] && [ "$lr" = "$target_lr" ] && detail=1 ;;
    esac
    ctx=(--label series=main --label "lr=$lr" --label "pair=$k")
    note load "lr=$lr" "pair=$k" "load1=$(cut -d' ' -f1 /proc/loadavg)"
    t0=$(date +%s.%N)
    log "lr $lr, pair $((k - 1))→$k$([ "$k" = "$median" ] && echo ' (median)'): hfdelta$([ $detail = 1 ] && echo ', 1 thread, peers')"
    settle "$base" "$new"
    bench readfloor --repeat 3 "$base" "$new" --append "$rec" "${ctx[@]}" --label what=inputs >/dev/null
    bench readfloor --repeat 3 --hash "$base" "$new" --append "$rec" "${ctx[@]}" --label what=inputs_hashed >/dev/null
    hfdelta_pair "$base" "$new" "$detail" 1
    [ "$detail" = 1 ] && peers_pair "$base" "$new"
    note timing "what=lr $lr, pair $((k - 1))→$k" "seconds=$(elapsed "$t0")"
    [ "$keep" = 1 ] || rm -rf "$base"
  done
  [ "$keep" = 1 ] || rm -rf "$series"
done

# ---- squash: one delta for a chain of versions ----------------------------------------

# squash_apply TOOL INPUT ARGS...: one timed apply of ARGS onto a fresh LOCAL
# at the series' first save, checked against the last (squash_chain's
# series, last, lc, mode, rep and flags).
squash_apply() {
  local tool=$1 input=$2
  shift 2
  rm -rf "$lc" && "$B/delta-apply" -q --init "$series/$(saven 0)" "$lc"
  settle "$input" "$lc"
  measure "$tool" "$mode" "$rep" "$B/delta-apply" -q "${flags[@]}" "$@" "$lc"
  same_tree "$last" "$lc"
}

# The chain of `saves` deltas of one series, in the default encoding at every
# step (entries compose), alternating xor and sparse (entries of one tensor
# stack), and context at every step (composed against the first save, given
# with --squash-base), against its squash and against a direct diff of the
# first and last saves; then a --root pull of the chain against applying the
# squash.
squash_chain() {
  local series=$1 kind=$2 root=$work/squash-root sq=$work/squash-out lc=$work/local k enc rep mode flags
  local last=$series/$(saven "$saves") first_v last_v sqflags=() direct_enc=sparse
  [ "$kind" = context ] && sqflags=(--squash-base "$series/$(saven 0)") && direct_enc=context
  first_v=$(printf 'weight_v%06d' 1)
  last_v=$(printf 'weight_v%06d' "$saves")
  ctx=(--label series=squash --label "chain=$kind")
  rm -rf "$root" "$sq" && mkdir -p "$root" "$sq"
  for ((k = 1; k <= saves; k++)); do
    enc=sparse
    [ "$kind" = mixed ] && [ $((k % 2)) = 1 ] && enc=xor
    [ "$kind" = context ] && enc=context
    "$B/delta-diff" -q --encoding "$enc" --delta-version "$k" --base-version $((k - 1)) \
      "$series/$(saven $((k - 1)))" "$series/$(saven "$k")" "$root/$(printf 'weight_v%06d' "$k")" ||
      die "delta-diff of pair $((k - 1))→$k failed"
  done
  bench size "$root" --append "$rec" "${ctx[@]}" --label tool=chain >/dev/null
  for ((rep = 1; rep <= repeat; rep++)); do
    rm -rf "${sq:?}/$last_v"
    settle "$root"
    measure squashed squash "$rep" "$B/delta-diff" -q --squash "${sqflags[@]}" "$root/$first_v" "$root/$last_v" "$sq/$last_v"
  done
  bench size "$sq/$last_v" --append "$rec" "${ctx[@]}" --label tool=squashed >/dev/null
  rm -rf "$work/squash-direct" && mkdir -p "$work/squash-direct"
  "$B/delta-diff" -q --encoding "$direct_enc" --delta-version "$saves" --base-version 0 "$series/$(saven 0)" "$last" "$work/squash-direct/$last_v" ||
    die "delta-diff of pair 0→$saves failed"
  bench size "$work/squash-direct/$last_v" --append "$rec" "${ctx[@]}" --label tool=direct >/dev/null
  rm -rf "$work/squash-direct"
  for mode in apply apply_nosync; do
    flags=()
    [ "$mode" = apply_nosync ] && flags=(--no-sync)
    for ((rep = 1; rep <= repeat; rep++)); do
      squash_apply chain "$root" --root "$root"
      squash_apply squashed "$sq/$last_v" "$sq/$last_v"
    done
  done
  rm -rf "$root" "$sq" "$lc"
}

if ! want squash; then
  log "squash: skipped (--sections)"
elif [ "$saves" -ge 2 ]; then
  series=$work/squash-series
  log "squash: a chain of $saves deltas, preset $preset, lr $target_lr"
  t0=$(date +%s.%N)
  "$B/hfdelta-gen" --preset "$preset" --saves "$saves" --lr "$target_lr" --steps-per-save "$steps" "$series" 2>&1 | sed 's/^/   /'
  for kind in sparse mixed context; do squash_chain "$series" "$kind"; done
  note timing "what=squash series" "seconds=$(elapsed "$t0")"
  [ "$keep" = 1 ] || rm -rf "$series"
else
  log "squash: skipped (a chain needs --saves 2 or more)"
fi

# ---- peak memory against model size ---------------------------------------------------

have_target=0
for lr in $lrs; do [ "$lr" = "$target_lr" ] && want main && have_target=1; done
want mem || mem_presets=""
for p in $mem_presets; do
  [ "$p" = "$preset" ] && [ "$have_target" = 1 ] && continue  # the main series covers it
  series=$work/mem-$p
  log "memory against model size: preset $p, lr $target_lr"
  t0=$(date +%s.%N)
  "$B/hfdelta-gen" --preset "$p" --saves 1 --lr "$target_lr" --steps-per-save "$steps" "$series" 2>&1 | sed 's/^/   /'
  ctx=(--label series=mem --label "preset=$p")
  bench bound "$series/save_000" "$series/save_001" --append "$rec" "${ctx[@]}" >/dev/null
  hfdelta_pair "$series/save_000" "$series/save_001" 0 0
  note timing "what=memory series, preset $p" "seconds=$(elapsed "$t0")"
  [ "$keep" = 1 ] || rm -rf "$series"
done

# ---- publishing from the trainer's memory ------------------------------------------

# The package in BUILDDIR/py-venv (as scripts/ci/python-test.sh makes it), installed
# from this tree unless it is already importable there.
py_venv() {
  local venv=$repo/$builddir/py-venv pip
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || return 1
  pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
  "${pip[@]}" install numpy safetensors ml_dtypes >&2 || return 1
  "$venv/bin/python" -c 'import hfdelta.publisher' 2>/dev/null ||
    "${pip[@]}" install "$repo" -Cbuild-dir="$repo/$builddir/py-build" >&2 || return 1
  echo "$venv/bin/python"
}

if want publish; then
  log "publishing from memory: preset $preset, lr $target_lr"
  t0=$(date +%s.%N)
  py=$(py_venv) || die "could not install the Python package into $builddir/py-venv"
  series=$work/publish-series
  "$B/hfdelta-gen" --preset "$preset" --saves 1 --lr "$target_lr" --steps-per-save "$steps" "$series" 2>&1 | sed 's/^/   /'
  sync
  "$py" "$repo/scripts/bench/bench_publish.py" "$series" "$work/publish" "$B/delta-diff" "$out/publish.json" \
    --repeat "$((repeat < 6 ? 6 : repeat))" >"$out/publish.md" || die "bench_publish.py failed"
  sed 's/^/   /' "$out/publish.md"
  note timing "what=publishing from memory" "seconds=$(elapsed "$t0")"
  [ "$keep" = 1 ] || rm -rf "$series" "$work/publish"
fi

if want sharded; then
  log "sharded publishing: preset $preset, lr $target_lr, ranks ${BENCH_RANKS:-1 2 4}"
  t0=$(date +%s.%N)
  py=$(py_venv) || die "could not install the Python package into $builddir/py-venv"
  "$py" -c 'import torch' 2>/dev/null || "$py" -m pip install -q --disable-pip-version-check torch >&2 ||
    die "could not install torch into $builddir/py-venv"
  series=$work/sharded-series
  "$B/hfdelta-gen" --preset "$preset" --saves 1 --lr "$target_lr" --steps-per-save "$steps" "$series" 2>&1 | sed 's/^/   /'
  "$py" "$repo/scripts/bench/sharded.py" "$series/save_000" "$series/save_001" "$out/sharded.json" \
    --ranks "${BENCH_RANKS:-1 2 4}" --delta-diff "$B/delta-diff" >"$out/sharded.md" || die "sharded.py failed"
  sed 's/^/   /' "$out/sharded.md"
  note timing "what=sharded publishing" "seconds=$(elapsed "$t0")"
  [ "$keep" = 1 ] || rm -rf "$series"
fi

if want kinds; then
  log "checkpoint kinds: mixture of experts, FP8, LoRA (scripts/bench/kinds.sh)"
  t0=$(date +%s.%N)
  "$repo/scripts/bench/kinds.sh" --bin "$B" --out "$out" --repeat "$repeat" | sed 's/^/   /'
  note timing "what=checkpoint kinds" "seconds=$(elapsed "$t0")"
fi

if want scale; then
  log "scale: a Qwen3-8B-shaped pair, cold and warm (scripts/bench/scale.sh)"
  rm -f "$out/scale.md"
  t0=$(date +%s.%N)
  rc=0
  "$repo/scripts/bench/scale.sh" --out "$out/scale.md" --work "$work/scale" | sed 's/^/   /' || rc=$?
  case $rc in
    0) note timing "what=scale" "seconds=$(elapsed "$t0")" ;;
    77) log "scale: skipped (the reason is above)" ;;
    *) die "scripts/bench/scale.sh failed (exit $rc)" ;;
  esac
fi

[ "$keep" = 1 ] || rm -rf "$work"
note timing "what=whole run" "seconds=$(elapsed "$t_start")"
bench report "$rec" --md "$out/results.md" --json "$out/results.json"
if want publish; then
  { echo; echo "## Publishing from the trainer's memory (preset $preset, lr $target_lr)"; echo; cat "$out/publish.md"; } >>"$out/results.md"
fi
if want sharded; then
  { echo; echo "## Sharded publishing (preset $preset, lr $target_lr)"; echo; cat "$out/sharded.md"; } >>"$out/results.md"
fi
if want kinds; then
  { echo; sed 's/^# /## /; s/^## \([A-Z]\)/### \1/' "$out/kinds.md"; } >>"$out/results.md"
fi
if want scale && [ -f "$out/scale.md" ]; then
  { echo; sed 's/^# /## /' "$out/scale.md"; } >>"$out/results.md"
fi
log "done: $out/results.md, $out/results.json"
echo
cat "$out/results.md"
exit 0
}
