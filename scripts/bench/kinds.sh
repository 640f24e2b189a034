#!/usr/bin/env bash
# Benchmark of the checkpoint kinds besides dense saves, side by side in one
# run (bench.sh's section `kinds`, or alone):
#
# - mixture of experts: a Qwen3-MoE save with Qwen3-30B-A3B's tensor count
#   (hfdelta-gen --preset qwen3-moe: 48 layers of 128 experts, 18 867 tensors)
#   against the same model with each layer's experts stacked into three
#   tensors (--stack-experts: the same bytes and training, 579 tensors). Diff
#   and apply times of each encoding, their ratio and the time per extra
#   tensor, and the layout costs: safetensors header bytes and index bytes of
#   the saves and the deltas.
# - FP8 with block scales: the small preset in F8_E4M3 with F32
#   weight_scale_inv per 128x128 block (--fp8), at two learning rates: the
#   wire size of every encoding against the order-0 entropy bound
#   (hfdelta-bench bound), diff and apply times; every apply checked byte for
#   byte.
# - LoRA adapters: a rank-16 PEFT adapter of the qwen3-0.6b shape
#   (--preset qwen3-0.6b --lora 16), in f32 (PEFT's default) and in bf16:
#   every element moves at every step; wire of every encoding against the
#   bound and the adapter's size.
#
# Usage: scripts/bench/kinds.sh [--bin DIR] [--out DIR] [--repeat N] [--fp8-lrs "A B"]
#                               [--moe-preset P] [--fp8-preset P] [--sections "moe fp8 lora"]
#   --bin DIR      delta-diff, delta-apply, hfdelta-gen and hfdelta-bench (default: BUILDDIR's)
#   --out DIR      results: OUT/kinds.md, OUT/kinds.json, OUT/kinds-records.jsonl
#                  (default BUILDDIR/bench); scratch in OUT/kinds-work, removed at the end
#   --repeat N     runs of every timed command, the minimum reported (default 3)
#   --sections S   which kinds to measure (default "moe fp8 lora")
# HFDELTA_BUILDDIR picks the build directory (default build).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
builddir=${HFDELTA_BUILDDIR:-build}
bin='' out='' repeat=3 fp8_lrs="1e-6 1e-5" moe_preset=qwen3-moe fp8_preset=small sections="moe fp8 lora"
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --fp8-lrs) fp8_lrs=$2; shift 2 ;;
    --moe-preset) moe_preset=$2; shift 2 ;;
    --fp8-preset) fp8_preset=$2; shift 2 ;;
    --sections) sections=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "kinds: unknown argument $1" >&2; exit 2 ;;
  esac
done
die() { echo "kinds: error: $*" >&2; exit 1; }
if [ -z "$bin" ]; then
  bin=$(mktemp -d)
  for b in src/delta-diff src/delta-apply tools/hfdelta-gen bench/hfdelta-bench; do
    [ -x "$builddir/$b" ] || die "$builddir/$b not built"
    cp "$builddir/$b" "$bin/"
  done
fi
out=${out:-$repo/$builddir/bench}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$out/kinds-work
rm -rf "$work"
mkdir -p "$work"
rec=$out/kinds-records.jsonl
: > "$rec"
B=$bin
t0=$SECONDS
log() { echo "[kinds $((SECONDS - t0)) s] $*"; }
bench() { "$B/hfdelta-bench" "$@"; }
settle() { sync; bench warm "$@" >/dev/null; }
encodings=$("$B/delta-diff" --help | sed -n 's/.*--encoding TEXT:{\([^}]*\)}.*/\1/p' | tr ',' ' ')

# timed LABELS... -- CMD: one record per run.
timed() {
  local labels=()
  while [ "$1" != -- ]; do labels+=(--label "$1"); shift; done
  shift
  bench run --append "$rec" "${labels[@]}" -- "$@" >/dev/null || die "failed: $*"
}

# pair KIND SERIES [FROM]: every encoding on save_FROM -> the next save of SERIES (FROM: 0).
pair() {
  local kind=$1 from=${3:-0} enc d l r
  local base=$2/save_00$from new=$2/save_00$((from + 1))
  bench bound "$base" "$new" --append "$rec" --label "series=$kind" >/dev/null
  bench layout "$base" --append "$rec" --label "series=$kind" --label what=save >/dev/null
  for enc in $encodings; do
    d=$work/d-$kind-$enc/weight_v000001
    mkdir -p "$(dirname "$d")"
    for ((r = 1; r <= repeat; r++)); do
      rm -rf "$d"
      settle "$base" "$new"
      timed "series=$kind" "encoding=$enc" mode=diff -- "$B/delta-diff" -q --encoding "$enc" "$base" "$new" "$d"
    done
    bench size "$d" --append "$rec" --label "series=$kind" --label "encoding=$enc" >/dev/null
    bench layout "$d" --append "$rec" --label "series=$kind" --label "encoding=$enc" --label what=delta >/dev/null
    l=$work/local-$kind
    for ((r = 1; r <= repeat; r++)); do
      "$B/delta-apply" -q --no-sync --init "$base" "$l"
      settle "$d" "$l"
      timed "series=$kind" "encoding=$enc" mode=apply_nosync -- "$B/delta-apply" -q --no-sync "$d" "$l"
    done
    for f in $(cd "$new" && ls); do cmp -s "$new/$f" "$l/$f" || die "$kind $enc: $l/$f differs from $new/$f"; done
    rm -rf "$work/d-$kind-$enc"
  done
  rm -rf "$work/local-$kind"
}

want() { [[ " $sections " == *" $1 "* ]]; }
want moe && log "mixture of experts: $moe_preset, experts apart and stacked"
want moe && for v in experts stacked; do
  flags=()
  [ "$v" = stacked ] && flags=(--stack-experts)
  "$B/hfdelta-gen" --preset "$moe_preset" --saves 1 --lr 1e-6 "${flags[@]}" "$work/moe-$v" 2>&1 | tail -n 1
  pair "moe-$v" "$work/moe-$v"
  rm -rf "$work/moe-$v"
done
want fp8 && for lr in $fp8_lrs; do
  log "FP8 with block scales: $fp8_preset at lr $lr"
  "$B/hfdelta-gen" --preset "$fp8_preset" --fp8 --saves 1 --lr "$lr" "$work/fp8-$lr" 2>&1 | tail -n 1
  pair "fp8-lr$lr" "$work/fp8-$lr"
  rm -rf "$work/fp8-$lr"
done
want lora && for dt in f32 bf16; do
  log "LoRA adapter: qwen3-0.6b shape, rank 16, $dt"
  # Save 1 -> 2: at step 1 only B moves (A's gradient is zero while B is).
  "$B/hfdelta-gen" --preset qwen3-0.6b --lora 16 --dtype "$dt" --saves 2 "$work/lora-$dt" 2>&1 | tail -n 1
  pair "lora-$dt" "$work/lora-$dt" 1
  rm -rf "$work/lora-$dt"
done
bench machine "$work" --append "$rec" >/dev/null
bench note --kind load --label "loadavg=$(cut -d' ' -f1-3 /proc/loadavg)" --append "$rec" >/dev/null
python3 scripts/bench/kinds_report.py "$rec" "$out/kinds.md" "$out/kinds.json" \
  --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
rm -rf "$work"
log "done: $out/kinds.md"
cat "$out/kinds.md"
