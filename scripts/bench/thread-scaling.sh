#!/usr/bin/env bash
# Thread scaling of delta-diff and delta-apply (--no-sync) on the generator's
# qwen3-0.6b pair, page cache warm, beside the floors of checked work at the
# same thread count (read+hash of BASE+NEW; read, hash twice, write back LOCAL).
# The figures are medians of REPS runs (wall time, process start included);
# vs_floor is the run over the floor at the same thread count.
# Opt-in (1.2 GB a save, two saves in WORKDIR); not part of bench.sh yet.
# Usage: scripts/bench/thread-scaling.sh BUILDDIR WORKDIR "1 2 4 8 16" [REPS]
#   ENCODINGS (default "sparse context auto"): the encodings timed.
# For a machine without the build dependencies (the device machine):
#   scripts/bench/thread-scaling.sh --prepare BUILDDIR   here: .devbench/ (git-ignored) holding
#       the four programs in BUILDDIR's layout and the shared libraries beyond libc they need;
#       there, pass .devbench as BUILDDIR.
set -euo pipefail
if [ "${1:-}" = --prepare ]; then
  cd "$(dirname "$0")/../.."
  b=$2; d=.devbench
  ninja -C "$b" src/delta-diff src/delta-apply tools/hfdelta-gen bench/hfdelta-bench >/dev/null
  rm -rf $d; mkdir -p $d/src $d/tools $d/bench $d/lib
  cp "$b/src/delta-diff" "$b/src/delta-apply" $d/src/; cp "$b/tools/hfdelta-gen" $d/tools/; cp "$b/bench/hfdelta-bench" $d/bench/
  . scripts/lab/carry.sh
  carry_libs $d/lib $d/src/* $d/tools/* $d/bench/*
  carry_ignored $d
  du -sh $d; exit 0
fi
build=$(cd "$1" && pwd)
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; W=$(mkdir -p "$2" && cd "$2" && pwd); threads=$3; reps=${4:-3}
bin=$W/bin; mkdir -p "$bin"
for t in src/delta-diff src/delta-apply tools/hfdelta-gen bench/hfdelta-bench; do ln -sf "$build/$t" "$bin/"; done
mkdir -p "$W"; cd "$W"
[ -d ckpt/save_001 ] || "$bin/hfdelta-gen" --preset qwen3-0.6b --saves 1 ckpt >/dev/null 2>&1
B=ckpt/save_000; N=ckpt/save_001
"$bin/hfdelta-bench" warm $B $N >/dev/null
med() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
t() { local s=$(date +%s.%N); "$@" >/dev/null 2>&1; echo "$(date +%s.%N) $s" | awk "{printf \"%.4f\\n\", \$1-\$2}"; }
printf '%-8s %-8s %8s %8s %8s\n' what enc threads median_s vs_floor
for th in $threads; do
  rec=floor.$th.jsonl; rm -f $rec
  "$bin/hfdelta-bench" readfloor --repeat $reps --threads $th --hash $B $N --append $rec >/dev/null
  fl_diff=$(python3 -c "import json;r=[json.loads(l) for l in open('$rec')][-1];print(r['median_s'])")
  for enc in ${ENCODINGS:-sparse context auto}; do
    ds=$(for i in $(seq $reps); do rm -rf root; mkdir root; t "$bin/delta-diff" --threads $th --encoding $enc --no-sync $B $N root/weight_v000001; done | med)
    echo "diff $enc $th $ds $fl_diff" | awk '{printf "%-8s %-8s %8d %8.3f %8.2f\n",$1,$2,$3,$4,$4/$5}'
    rm -rf rootkeep; mkdir rootkeep; "$bin/delta-diff" --encoding $enc --no-sync $B $N rootkeep/weight_v000001 >/dev/null
    as=$(for i in $(seq $reps); do rm -rf local; "$bin/delta-apply" --init --no-sync $B local >/dev/null; t "$bin/delta-apply" --threads $th --no-sync rootkeep/weight_v000001 local; done | med)
    rm -rf lc; cp -r $B lc
    rec2=rw.$th.jsonl; rm -f $rec2
    "$bin/hfdelta-bench" readfloor --repeat $reps --threads $th --hash --write-back lc --append $rec2 >/dev/null
    fl_ap=$(python3 -c "import json;r=[json.loads(l) for l in open('$rec2')][-1];print(r['median_s'])")
    echo "apply $enc $th $as $fl_ap" | awk '{printf "%-8s %-8s %8d %8.3f %8.2f\n",$1,$2,$3,$4,$4/$5}'
  done
  echo "floor read+hash BASE+NEW threads=$th: $fl_diff s; rewrite LOCAL: $fl_ap s"
done
