#!/usr/bin/env bash
# shellcheck disable=SC2015,SC2317  # "A && B || die" checks; functions called through check and wait_until
# An engine across hosts, each node a host of its own: a network namespace
# (its eth0 one end of a veth pair on a bridge where SeaweedFS listens), a
# UTS namespace (its own host name, so each report is named by default), its
# own `weed mount` of the filer that holds the publication root and the
# reports directory, its own LOCAL and its own pull loop. Opt-in (root, FUSE,
# network namespaces, a minute or two); not part of `meson test`, which runs
# the same protocol with separate LOCALs (tests/e2e_hosts.cpp). What this adds:
# the nodes see each other's reports only through their own mounts of shared
# storage (with its caching), over a network link, each in its own process
# tree, as separate hosts would.
#
#   publisher (this namespace, its own weed mount): --versions saves
#     published into MOUNT/peers/root, one every --interval seconds.
#   node1: `delta-apply --root ROOT LOCAL --report-to DIR --peers node2,... --then
#     RELOAD` every --poll seconds. RELOAD stands in for the engine's reload:
#     it records the version and what every node's LOCAL holds at that moment.
#   node2..N: `delta-apply --root ROOT LOCAL --report-to DIR --follow node1`.
#
# Phases: (a) every node online, every version published: each reload must
# find every LOCAL at its version; (b) the last node taken offline (its loop
# stopped) and one more version published: node1 must exit 15 naming it, with
# no reload of that version; (c) the node back: node1 must reload that version
# once the node catches up. The fleet view is printed at the end. Results (the
# reloads, the time from each publication to its reload, the exit codes of
# node1's runs) go to --out as markdown.
#
# Usage: scripts/lab/peers.sh [OPTIONS]
#   --nodes N          nodes of the engine (default 3, at least 2)
#   --versions N       versions published in phase (a) (default 3)
#   --interval S       seconds between two publications (default 4)
#   --poll S           seconds between two pulls of a node (default 1)
#   --peer-timeout S   node1's --peer-timeout (default 6)
#   --subnet A.B.C     the bridge's /24 (default 10.213.78; .1 is SeaweedFS)
#   --out FILE         results file (default BUILDDIR/peers-results.md)
#   --keep             keep the work dir
# Environment: HFDELTA_BUILDDIR (default build), or HFDELTA_DIFF,
# HFDELTA_APPLY, HFDELTA_FLEET, HFDELTA_GEN; LAB_TMP (where the work dir goes).
# Exit: 0 every check passed, 1 a check failed, 2 usage, 77 cannot run here
# (the reason is printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
builddir=${HFDELTA_BUILDDIR:-build}
# shellcheck source=scripts/lab/storage-lab.sh
. "$repo/scripts/lab/storage-lab.sh"
lab_tools "$repo"

nodes=3 versions=3 interval=4 poll=1 peer_timeout=6 subnet=10.213.78 out='' keep=0
usage() { sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "peers: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=$2; shift 2 ;;
    --versions) versions=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --poll) poll=$2; shift 2 ;;
    --peer-timeout) peer_timeout=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 2 ] && [ "$nodes" -le 50 ] || die "--nodes: 2 to 50"
[[ $versions =~ ^[0-9]+$ ]] && [ "$versions" -ge 1 ] || die "--versions: at least 1"
[[ $subnet =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet: three numbers, as 10.213.78"
[ -z "$out" ] || out=$(realpath -m "$out")
LAB_KEEP=$keep

if ! reasons=$(lab_require root weed fuse netns); then echo "$reasons"; exit 77; fi
command -v unshare > /dev/null || { echo "skip: unshare (util-linux) not found: each node needs a host name of its own"; exit 77; }
for b in "$DIFF" "$APPLY" "$FLEET" "$GEN"; do [ -x "$b" ] || { echo "peers: $b is not built"; exit 1; }; done
"$APPLY" --help | grep -q -- '--report-to' || { echo "peers: $APPLY has no --report-to (built before it)"; exit 1; }
if ip -4 -o addr show | grep " $subnet\." > /dev/null; then
  echo "skip: $subnet.0/24 is already in use here; pick another with --subnet"; exit 77
fi

t_wall=$(date +%s.%N)
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "peers: [$(since "$t_wall") s] $*"; }

lab_init hfdelta-peers
T=$LAB_DIR
out=${out:-$repo/$builddir/peers-results.md}
mkdir -p "$(dirname "$out")"
lab_bridge hfdpeer0 "$subnet.1/24"
lab_server_start "$subnet.1"
lab_mount "$T/pub"
mkdir -p "$T/pub/peers/root" "$T/pub/peers/reports"

last=$((versions + 1))
say "generating $last saves after the base (preset tiny)"
"$GEN" --preset tiny --saves "$last" "$T/series" > "$T/gen.log" 2>&1
save() { printf '%s/series/save_%03d' "$T" "$1"; }
publish() {
  "$DIFF" -q "$(save $(($1 - 1)))" "$(save "$1")" "$T/pub/peers/root"
  now > "$T/published.$1"
  say "published version $1"
}

# The engine's reload, run by node1's delta-apply after each of its runs: as
# contrib/reload-vllm.sh, it skips a version already reloaded; otherwise one
# line, the version and what every node's LOCAL (host-local disks, all under
# $T here) holds at that moment, "ok" when all hold it.
peers_csv=$(for ((i = 2; i <= nodes; i++)); do printf 'node%d,' "$i"; done)
peers_csv=${peers_csv%,}
cat > "$T/reload.sh" <<EOF
#!/bin/sh
[ "\$(cat "$T/reloaded.version" 2>/dev/null)" = "\$HFDELTA_VERSION" ] && exit 0
held() { sed -n 's/.*"version": *"\\([0-9]*\\)".*/\\1/p' "$T/n\$1/local/.weight_sync/state.json"; }
line="\$(date +%s.%N) \$HFDELTA_VERSION"
verdict=ok
for i in \$(seq 1 $nodes); do
  v=\$(held "\$i"); line="\$line node\$i=\$v"
  [ "\$v" = "\$HFDELTA_VERSION" ] || verdict=MISMATCH
done
echo "\$line \$verdict" >> "$T/reloads.log"
echo "\$HFDELTA_VERSION" > "$T/reloaded.version"
EOF
chmod +x "$T/reload.sh"

declare -a ns loop_pid
for ((i = 1; i <= nodes; i++)); do
  ns[i]=hfdpeer-n$i
  lab_netns "${ns[i]}" hfdpeer0 "$subnet.$((10 + i))/24" "hfdpv$i"
  lab_mount "$T/n$i/mnt" "${ns[i]}"
  mkdir -p "$T/n$i/log"
  "$APPLY" -q --init "$(save 0)" "$T/n$i/local"
  # The node's loop, run in its namespaces: no --host, so its report is named
  # by the host name its UTS namespace gives it.
  if [ "$i" = 1 ]; then role=(--peers "$peers_csv" --peer-timeout "$peer_timeout" --then "$T/reload.sh")
  else role=(--follow node1); fi
  {
    echo '#!/bin/bash'
    echo "while [ ! -e '$T/stop' ] && [ ! -e '$T/n$i/offline' ]; do"
    echo "  rc=0; '$APPLY' -q --root '$T/n$i/mnt/peers/root' '$T/n$i/local' --report-to '$T/n$i/mnt/peers/reports' $(printf "'%s' " "${role[@]}") 2>> '$T/n$i/log/stderr' || rc=\$?"
    echo "  echo \"\$(date +%s.%N) \$rc\" >> '$T/n$i/log/pulls'"
    echo "  sleep $poll"
    echo "done"
  } > "$T/n$i/loop.sh"
done

start_node() {
  local i=$1
  rm -f "$T/n$i/offline"
  nsenter --net="/run/netns/${ns[i]}" unshare --uts bash -c "hostname node$i && exec bash '$T/n$i/loop.sh'" &
  loop_pid[i]=$!
  say "node$i pulling (pid ${loop_pid[i]}, network namespace ${ns[i]})"
}
stop_node() {
  local i=$1 k
  touch "$T/n$i/offline"
  for ((k = 0; k < 600; k++)); do kill -0 "${loop_pid[i]}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${loop_pid[i]}" 2>/dev/null; then kill "${loop_pid[i]}" 2>/dev/null || true; fi
  wait "${loop_pid[i]}" 2>/dev/null || true
  loop_pid[i]=
  say "node$i offline"
}
stop_all() {
  local i
  touch "$T/stop"
  for ((i = 1; i <= nodes; i++)); do [ -z "${loop_pid[i]:-}" ] || stop_node "$i"; done
}
lab_on_cleanup stop_all

reloaded() { grep -q " $(printf '%06d' "$1") " "$T/reloads.log" 2>/dev/null; }
wait_until() { # SECONDS WHAT COMMAND...: true once COMMAND succeeds
  local limit=$1 what=$2 t0=$SECONDS; shift 2
  until "$@"; do
    if [ $((SECONDS - t0)) -ge "$limit" ]; then say "timed out after $limit s waiting for $what"; return 1; fi
    sleep 0.2
  done
}

fail=0
check() { if "$@"; then return 0; fi; fail=1; return 1; }

for ((i = 1; i <= nodes; i++)); do start_node "$i"; done

say "phase (a): every node online, versions 1..$versions"
for ((v = 1; v <= versions; v++)); do
  sleep "$interval"
  publish "$v"
done
check wait_until 120 "the reload of version $versions" reloaded "$versions" || true

say "phase (b): node$nodes offline, version $last published"
stop_node "$nodes"
publish "$last"
n1_report=$T/pub/peers/reports/node1.json
refused() { grep -q '"exit_code": 15' "$n1_report" 2>/dev/null && grep -q "node$nodes: holds" "$n1_report"; }
check wait_until $((peer_timeout * 4 + 60)) "node1 to exit 15 naming node$nodes" refused || true
b_error=$(sed -n 's/.*"message": "\(.*\)".*/\1/p' "$n1_report" | head -1)
say "node1's report: ${b_error:-?}"
if reloaded "$last"; then say "FAIL: version $last was reloaded with node$nodes offline"; fail=1; fi

say "phase (c): node$nodes back"
start_node "$nodes"
check wait_until 120 "the reload of version $last" reloaded "$last" || true
stop_all
fleet=$("$FLEET" --reports "$T/pub/peers/reports" "$T/pub/peers/root" 2>&1) || true
echo "$fleet"

# Every reload found every LOCAL at its version.
if grep -q MISMATCH "$T/reloads.log" 2>/dev/null; then say "FAIL: a reload found a node on another version"; fail=1; fi
n15=$(awk '$2 == 15' "$T/n1/log/pulls" | wc -l)
codes=$(awk '{ c[$2]++ } END { for (k in c) printf "%s%s: %d", (n++ ? ", " : ""), k, c[k] }' "$T/n1/log/pulls")
[ "$n15" -ge 1 ] || { say "FAIL: node1 never exited 15"; fail=1; }

rows=()
while read -r t ver rest; do
  v=$((10#$ver))
  lag=-
  [ ! -e "$T/published.$v" ] || lag=$(awk -v a="$(cat "$T/published.$v")" -v b="$t" 'BEGIN { printf "%.1f", b - a }')
  rows+=("| $ver | $lag | $rest |")
done < "$T/reloads.log"

{
  echo "## hfdelta: an engine across $nodes hosts (network namespaces, SeaweedFS FUSE mounts)"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, weed $("$LAB_WEED" version 2>/dev/null | awk '{print $3; exit}'), preset tiny, $nodes nodes, poll every $poll s, --peer-timeout $peer_timeout s, publish every $interval s"
  echo
  echo "| version reloaded | s after publication | what each LOCAL held at the reload |"
  echo "|---|---:|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "- node1's runs by exit code: $codes"
  echo "- phase (b), node$nodes offline: node1's report said: ${b_error:-?}"
  echo
  echo '```'
  echo "$fleet"
  echo '```'
} > "$out"
echo
cat "$out"
echo "peers: results in $out"
if [ "$fail" = 0 ]; then say "PASS: every reload found every node at its version; an offline node stopped the reload, named"
else say "FAILED"; fi
exit "$fail"
