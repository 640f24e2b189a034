#!/usr/bin/env bash
# The context encoding's cost against sparse's, as a ratio measured side by
# side: on the generator's qwen3-0.6b pair, delta-diff --encoding context
# against --encoding sparse, and delta-apply --no-sync of the context delta
# against the sparse one, at each thread count, in turns (context, sparse,
# context, ...; each after a sync), so that a load on the machine falls on
# both. Prints the median wall time of each and the median of the per-round
# ratios context / sparse, beside the goals (apply at most 1.25, diff at
# most 1.15); a missed goal is reported, not an error.
# Opt-in (two saves of 1.2 GB in WORKDIR, two LOCALs beside them; WORKDIR on
# tmpfs, e.g. /dev/shm, takes the disk out); about a minute a thread count
# at 5 rounds once the pair is generated (kept in WORKDIR/ckpt).
# Usage: scripts/bench/context-vs-sparse.sh BUILDDIR WORKDIR [ROUNDS (5)] [THREADS ("1 2")]
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
build=$(cd "$1" && pwd)
W=$(mkdir -p "$2" && cd "$2" && pwd)
rounds=${3:-5}
threads=${4:-1 2}
cd "$W"
[ -d ckpt/save_001 ] || "$build/tools/hfdelta-gen" --preset qwen3-0.6b --saves 1 ckpt >/dev/null
B=ckpt/save_000 N=ckpt/save_001
for enc in context sparse; do
  rm -rf "keep-$enc" && mkdir "keep-$enc"
  "$build/src/delta-diff" -q --no-sync --encoding $enc $B $N "keep-$enc/weight_v000001"
done
now() { date +%s.%N; }
# timed LABEL CMD...: appends "LABEL seconds" to times.txt.
timed() {
  local label=$1 s
  shift
  sync
  s=$(now)
  "$@" >/dev/null
  echo "$label $(awk -v a="$s" -v b="$(now)" 'BEGIN { print b - a }')" >>times.txt
}
: >times.txt
for r in $(seq 0 "$rounds"); do # round 0 warms up and is dropped
  for th in $threads; do
    for enc in context sparse; do
      rm -rf "out-$enc" && mkdir "out-$enc"
      timed "$r diff $th $enc" "$build/src/delta-diff" -q --no-sync --threads "$th" --encoding $enc $B $N "out-$enc/weight_v000001"
    done
    for enc in context sparse; do
      rm -rf "local-$enc" && "$build/src/delta-apply" -q --init --no-sync $B "local-$enc"
    done
    for enc in context sparse; do
      timed "$r apply $th $enc" "$build/src/delta-apply" -q --no-sync --threads "$th" "keep-$enc/weight_v000001" "local-$enc"
    done
  done
done
rm -rf out-context out-sparse local-context local-sparse
python3 - "$rounds" <<'EOF'
import statistics, sys
t = {}
for line in open("times.txt"):
    r, what, th, enc, s = line.split()
    if r != "0":
        t.setdefault((what, int(th)), {}).setdefault(enc, []).append(float(s))
goal = {"apply": 1.25, "diff": 1.15}
print(f"{'what':6} {'threads':>7} {'context_s':>9} {'sparse_s':>9} {'ratio':>6} {'range':>11}  goal")
for (what, th), d in sorted(t.items()):
    ratios = [c / s for c, s in zip(d["context"], d["sparse"])]
    m = statistics.median(ratios)
    print(f"{what:6} {th:7} {statistics.median(d['context']):9.3f} {statistics.median(d['sparse']):9.3f} {m:6.3f} "
          f"{min(ratios):5.3f}-{max(ratios):5.3f}  <= {goal[what]}: {'met' if m <= goal[what] else 'MISSED'}")
print(f"(medians of {sys.argv[1]} rounds; ratio: median of the rounds' context / sparse)")
EOF
