#!/usr/bin/env bash
# shellcheck disable=SC2015,SC2012  # "A && B || die" checks; ls of names we wrote
# Fan-out on a network filesystem: one publisher and many pulling hosts on a
# SeaweedFS filer mounted with FUSE (`weed mount`), each host in a network
# namespace of its own, so that what each one reads crosses a link that counts
# it. Opt-in (it needs root, FUSE, network namespaces and a few minutes); not
# part of `meson test`.
#
#   publisher (this namespace, its own weed mount): a series of --versions
#     saves published into MOUNT/fanout/root, one every --interval seconds:
#     deltas, and at --full-at a `delta-diff --full BASE NEW` version (a full
#     checkpoint with its delta sidecar); two versions later, while the hosts
#     poll, `delta-diff --prune` removes what no host needs any more.
#   hosts (--hosts, each in network namespace hfdfan-hN, whose eth0 is one end
#     of a veth pair on a bridge where SeaweedFS listens, each with its own
#     weed mount started in that namespace and its own LOCAL): a loop of
#     `delta-apply --json --root MOUNT/fanout/root LOCAL` every --poll seconds
#     until LOCAL holds the last version. Half of them start with the series,
#     initialised with --init from the base save (version 0); a quarter start
#     as new hosts (an empty LOCAL) just after the full version is published;
#     the rest start as new hosts after the last version (and the prune).
#
# At the end every LOCAL must be byte-identical to the last save (diff -r,
# .weight_sync aside). Printed, and written to --out as markdown: wall time;
# per host its pulls, the pulls that found a version not published yet, the
# ones that failed (exit codes), the bytes delta-apply reports (delta_bytes,
# root_bytes, summed over its pulls) and the bytes its eth0 received and sent
# during the series (the host end of its veth pair, /sys/class/net/*/statistics);
# what the storage served in total (the sum over the veths), and SeaweedFS's
# own count of volume-server reads.
#
# Usage: scripts/lab/fanout.sh [OPTIONS]
#   --hosts N       pulling hosts (default 8, at least 4)
#   --versions N    versions published after the base (default 10, at least 4)
#   --full-at N     version published as --full BASE NEW (default versions/2 + 1)
#   --size P        hfdelta-gen preset: tiny, small, qwen3-0.6b (default small)
#   --interval S    seconds between two publications (default 2)
#   --poll S        seconds between two pulls of a host (default 0.5)
#   --timeout S     how long hosts may take to reach the last version once it
#                   is published (default 300)
#   --subnet A.B.C  the bridge's /24 (default 10.213.77; .1 is SeaweedFS)
#   --out FILE      results file (default BUILDDIR/fanout-results.md)
#   --keep          keep the work dir (saves, roots, LOCALs, logs)
# Environment: HFDELTA_BUILDDIR (default build: binaries in BUILDDIR/src and BUILDDIR/tools),
# or HFDELTA_DIFF, HFDELTA_APPLY, HFDELTA_GEN; LAB_TMP (where the work dir
# goes, default /tmp). Without the --full option (a build before it), the
# full version is published by hand the way docs/format.md ("Full versions")
# describes (a copy under a hidden name, then a rename) and has no delta
# sidecar.
# Exit: 0 every LOCAL identical, 1 a failure, 2 usage, 77 cannot run here
# (the reason is printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
builddir=${HFDELTA_BUILDDIR:-build}
# shellcheck source=scripts/lab/storage-lab.sh
. "$repo/scripts/lab/storage-lab.sh"
lab_tools "$repo"

hosts=8 versions=10 full_at='' size=small interval=2 poll=0.5 timeout=300 subnet=10.213.77 out='' keep=0
usage() { sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "fanout: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --hosts) hosts=$2; shift 2 ;;
    --versions) versions=$2; shift 2 ;;
    --full-at) full_at=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --poll) poll=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ $hosts =~ ^[0-9]+$ ]] && [ "$hosts" -ge 4 ] && [ "$hosts" -le 200 ] || die "--hosts: 4 to 200"
[[ $versions =~ ^[0-9]+$ ]] && [ "$versions" -ge 4 ] || die "--versions: at least 4"
full_at=${full_at:-$((versions / 2 + 1))}
[[ $full_at =~ ^[0-9]+$ ]] && [ "$full_at" -ge 2 ] && [ "$full_at" -le "$versions" ] || die "--full-at: 2 to --versions"
case $size in tiny | small | qwen3-0.6b) ;; *) die "--size: tiny, small or qwen3-0.6b" ;; esac
[[ $subnet =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--subnet: three numbers, as 10.213.77"
[ -z "$out" ] || out=$(realpath -m "$out")
LAB_KEEP=$keep

if ! reasons=$(lab_require root weed fuse netns); then echo "$reasons"; exit 77; fi
for b in "$DIFF" "$APPLY" "$GEN"; do [ -x "$b" ] || { echo "fanout: $b is not built"; exit 1; }; done
if ip -4 -o addr show | grep " $subnet\." > /dev/null; then
  echo "skip: $subnet.0/24 is already in use here; pick another with --subnet"; exit 77
fi
has_full=0
"$DIFF" --help | grep -- '--full' > /dev/null && has_full=1

t_wall=$(date +%s.%N)
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "fanout: [$(since "$t_wall") s] $*"; }

lab_init hfdelta-fanout
T=$LAB_DIR
out=${out:-$repo/$builddir/fanout-results.md}
mkdir -p "$(dirname "$out")"
br=hfdfan0
lab_bridge "$br" "$subnet.1/24"
lab_server_start "$subnet.1"

# What rename does on a weed mount (delta-diff publishes with
# renameat2(RENAME_NOREPLACE) where it works, plain rename(2) where it gets EINVAL).
rename_probe() {
  python3 - "$1" <<'EOF'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
d = sys.argv[1]
for n in ("a", "b"):
    os.makedirs(f"{d}/{n}", exist_ok=True)
    open(f"{d}/{n}/f", "w").write(n)
def noreplace(src, dst):
    r = libc.renameat2(-100, src.encode(), -100, dst.encode(), 1)
    return "ok" if r == 0 else os.strerror(ctypes.get_errno())
over = noreplace(f"{d}/a", f"{d}/b")      # onto an existing directory: must fail, EEXIST
new = noreplace(f"{d}/a", f"{d}/c")       # onto nothing: must work
print(f"renameat2(RENAME_NOREPLACE): onto an existing directory -> {over}; onto a new name -> {new}")
EOF
}

lab_mount "$T/pub"
root=$T/pub/fanout/root
mkdir -p "$root" "$T/pub/fanout/probe"
rename_result=$(rename_probe "$T/pub/fanout/probe")
rm -rf "$T/pub/fanout/probe"
say "weed mount: $rename_result"

say "generating $versions saves after the base (preset $size) in $T/series"
"$GEN" --preset "$size" --saves "$versions" "$T/series" > "$T/gen.log" 2>&1
save() { printf '%s/series/save_%03d' "$T" "$1"; }
vname() { printf 'weight_v%06d' "$1"; }
full_bytes=$(du -sb "$(save 0)" | cut -f1)

# Host i: namespace hfdfan-hI, eth0 at $subnet.(10+I), veth hfdfvI here.
# Groups: init (from the base, at the start), atfull (new, after the full
# version), atend (new, after the last version).
declare -a group ns veth started_at loop_pid
n_init=$(((hosts + 1) / 2))
n_atfull=$(((hosts - n_init + 1) / 2))
for ((i = 1; i <= hosts; i++)); do
  ns[i]=hfdfan-h$i veth[i]=hfdfv$i
  if [ "$i" -le "$n_init" ]; then group[i]=init
  elif [ "$i" -le $((n_init + n_atfull)) ]; then group[i]=atfull
  else group[i]=atend; fi
  lab_netns "${ns[i]}" "$br" "$subnet.$((10 + i))/24" "${veth[i]}"
  lab_mount "$T/h$i/mnt" "${ns[i]}"
  mkdir -p "$T/h$i/log"
done

# One host's polling loop, in its namespace. It records every pull (time,
# exit code, --json summary) in h$i/log/pulls and stops once LOCAL holds the
# last version, or when $T/stop appears (cleanup).
state_version() { sed -n 's/.*"version": *"\([0-9]*\)".*/\1/p' "$1/.weight_sync/state.json" 2>/dev/null; }
host_loop() {
  local i=$1 h=$T/h$1 target rc js
  target=$(printf '%06d' "$versions")
  while [ ! -e "$T/stop" ]; do
    rc=0
    js=$(nsenter --net="/run/netns/${ns[i]}" "$APPLY" --json --threads 1 --root "$h/mnt/fanout/root" "$h/local" \
      2>> "$h/log/stderr") || rc=$?
    [ -n "$js" ] || js='{}'
    printf '%s %s %s\n' "$(now)" "$rc" "$js" >> "$h/log/pulls"
    if [ "$(state_version "$h/local")" = "$target" ]; then now > "$h/log/done"; return 0; fi
    sleep "$poll"
  done
}
stop_hosts() {
  local i k
  [ -e "$T/stop" ] || touch "$T/stop"
  for ((i = 1; i <= hosts; i++)); do
    [ -n "${loop_pid[i]:-}" ] || continue
    for ((k = 0; k < 100; k++)); do kill -0 "${loop_pid[i]}" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "${loop_pid[i]}" 2>/dev/null; then lab_say "host loop $i (pid ${loop_pid[i]}) still running: SIGTERM"; kill "${loop_pid[i]}" 2>/dev/null; fi
    wait "${loop_pid[i]}" 2>/dev/null || true
  done
}
lab_on_cleanup stop_hosts
start_host() {
  local i=$1
  started_at[i]=$(now)
  if [ "${group[i]}" = init ]; then
    "$APPLY" -q --init "$(save 0)" "$T/h$i/local"
  else
    mkdir -p "$T/h$i/local"   # a new host: an empty LOCAL
  fi
  host_loop "$i" &
  loop_pid[i]=$!
  say "host $i (${group[i]}) polling (pid ${loop_pid[i]})"
}

# Counters at the start of the series: the mounts' start-up traffic is left out.
declare -a rx0 tx0
for ((i = 1; i <= hosts; i++)); do
  rx0[i]=$(lab_link_bytes "${veth[i]}" tx)   # what the host's eth0 receives is what its veth end sends
  tx0[i]=$(lab_link_bytes "${veth[i]}" rx)
done
volume_gets() {
  lab_http GET "http://$subnet.1:$LAB_METRICS_PORT/metrics" |
    awk '/^SeaweedFS_volumeServer_request_total\{code="2[0-9][0-9]",type="GET"\}/ { s += $2 } END { printf "%d\n", s }'
}
gets0=$(volume_gets)

t_series=$(now)
for ((i = 1; i <= hosts; i++)); do [ "${group[i]}" != init ] || start_host "$i"; done

prune_report='' prune_summary=''
for ((v = 1; v <= versions; v++)); do
  sleep "$interval"
  if [ "$v" = "$full_at" ]; then
    if [ "$has_full" = 1 ]; then
      "$DIFF" -q --full "$(save $((v - 1)))" "$(save "$v")" "$root/$(vname "$v")"
      say "published $(vname "$v") as --full BASE NEW (full, and delta_v$(printf '%06d' "$v") beside it)"
    else
      tmp=$root/.$(vname "$v").tmp
      cp -r "$(save "$v")" "$tmp" && sync && mv "$tmp" "$root/$(vname "$v")"
      say "published $(vname "$v") as a full copy (cp, sync, mv: this delta-diff has no --full)"
    fi
    for ((i = 1; i <= hosts; i++)); do [ "${group[i]}" != atfull ] || start_host "$i"; done
  else
    "$DIFF" -q "$(save $((v - 1)))" "$(save "$v")" "$root/$(vname "$v")"
    say "published $(vname "$v")"
  fi
  [ "$v" != "$versions" ] || t_last=$(now)
  if [ "$v" = $((full_at + 2)) ] || { [ "$v" = "$versions" ] && [ -z "$prune_report" ]; }; then
    prune_report=$("$DIFF" --prune "$root" --json) || die "delta-diff --prune failed"
    prune_summary="delta-diff --prune after version $v: $(python3 -c '
import json, sys
r = json.loads(sys.argv[1])
name = lambda e: e["path"].rsplit("/", 1)[-1] + (" (full)" if e.get("full") else " (sidecar)" if e.get("sidecar") else "")
print("removed", ", ".join(map(name, r.get("removed", []))) or "nothing", "(%d bytes); kept" % r.get("bytes_removed", 0),
      ", ".join(map(name, r.get("kept", []))))' "$prune_report" 2>/dev/null || echo "$prune_report")"
    say "$prune_summary"
  fi
done
published_bytes=$(du -sb "$root" | cut -f1)
say "series published; root now holds: $(cd "$root" && ls | tr '\n' ' ')"
for ((i = 1; i <= hosts; i++)); do [ "${group[i]}" != atend ] || start_host "$i"; done

deadline=$((SECONDS + timeout))
for ((i = 1; i <= hosts; i++)); do
  while [ ! -e "$T/h$i/log/done" ] && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
done
touch "$T/stop"
stop_hosts
t_end=$(now)
gets1=$(volume_gets)

# Per host: pulls, not-yet pulls, failed pulls, summed delta_bytes/root_bytes.
pull_stats() { # FILE -> "pulls notyet failures(codes) delta_bytes root_bytes full_copies sidecars"
  awk '{
    n++
    if ($2 != 0) { f++; codes = codes (codes ? "," : "") $2 }
    line = $0
    if (line ~ /"not_published_yet":"[0-9]/ || line ~ /"not_published_yet":\[[^\]]/) ny++
    if (match(line, /"delta_bytes":[0-9]+/)) db += substr(line, RSTART + 14, RLENGTH - 14)
    if (match(line, /"root_bytes":[0-9]+/)) rb += substr(line, RSTART + 13, RLENGTH - 13)
    if (line ~ /"full_copied":"[0-9]/) fc++
    if (match(line, /"sidecars_applied":[0-9]+/)) sc += substr(line, RSTART + 19, RLENGTH - 19)
  } END { printf "%d %d %s %d %d %d %d\n", n, ny, (f ? f " (" codes ")" : "0"), db, rb, fc, sc }' "$1"
}

fail=0
rows=()
total_rx=0
for ((i = 1; i <= hosts; i++)); do
  rx=$(($(lab_link_bytes "${veth[i]}" tx) - rx0[i]))
  tx=$(($(lab_link_bytes "${veth[i]}" rx) - tx0[i]))
  total_rx=$((total_rx + rx))
  read -r pulls notyet failures db rb fc sc <<<"$(pull_stats "$T/h$i/log/pulls" | sed 's/ (\([^)]*\))/(\1)/')"
  ver=$(state_version "$T/h$i/local")
  if [ "$ver" = "$(printf '%06d' "$versions")" ] && diff -r --exclude=.weight_sync "$(save "$versions")" "$T/h$i/local" > /dev/null; then
    same=yes
  else
    same="NO (version ${ver:-none})"; fail=1
  fi
  if [ -e "$T/h$i/log/done" ]; then
    took=$(awk -v a="${started_at[i]}" -v b="$(cat "$T/h$i/log/done")" 'BEGIN { printf "%.1f", b - a }')
    lag=$(awk -v a="$t_last" -v b="$(cat "$T/h$i/log/done")" 'BEGIN { printf "%.1f", b - a }')
  else took=-; lag=-; fi
  start=$(awk -v a="$t_series" -v b="${started_at[i]}" 'BEGIN { printf "%.1f", b - a }')
  rows+=("| $i | ${group[i]} | $start | $took | $lag | $pulls | $notyet | $failures | $fc | $sc | $db | $rb | $rx | $tx | $same |")
done

{
  echo "## hfdelta fan-out on a SeaweedFS FUSE mount"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, weed $("$LAB_WEED" version 2>/dev/null | awk '{print $3; exit}'), preset $size ($full_bytes bytes per checkpoint), $versions versions (full at $full_at$([ "$has_full" = 1 ] && echo ", --full BASE NEW" || echo ", copied: no --full in this build")), $hosts hosts, publish every ${interval} s, poll every ${poll} s"
  echo
  echo "| host | start | started (s) | took (s) | after last publish (s) | pulls | not yet | failed (codes) | full copies | sidecars | delta_bytes | root_bytes | eth0 RX (B) | eth0 TX (B) | identical |"
  echo "|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "- wall time: $(awk -v a="$t_wall" -v b="$t_end" 'BEGIN { printf "%.1f", b - a }') s in all; series (first host start to last host done): $(awk -v a="$t_series" -v b="$t_end" 'BEGIN { printf "%.1f", b - a }') s"
  echo "- storage served to the hosts (sum of eth0 RX over the series): $total_rx bytes ($(awk -v a="$total_rx" -v f="$full_bytes" 'BEGIN { printf "%.2f", a / f }') checkpoints)"
  echo "- SeaweedFS volume-server reads (successful GETs, its /metrics): $((gets1 - gets0))"
  echo "- root after the series: $published_bytes bytes; $prune_summary"
  echo "- weed mount: $rename_result"
  echo
  echo "started: when the host began polling, from the start of the series; took: from then until LOCAL held version $versions. not yet: pulls that found a version not published yet (incomplete); full copies, sidecars, delta_bytes, root_bytes: from delta-apply --json, summed over the host's pulls. eth0 RX/TX count everything on the link (metadata subscriptions, TCP/IP headers), so they exceed delta-apply's own figures. init hosts began at version 0 (--init of the base); atfull and atend hosts are new hosts with an empty LOCAL."
} > "$out"
echo
cat "$out"
echo
echo "fanout: results in $out"
if [ "$fail" = 0 ]; then say "every LOCAL is byte-identical to save $versions"; else say "FAILED: some LOCAL differs from save $versions"; fi
exit "$fail"
