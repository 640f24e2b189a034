#!/bin/sh
# reload-sglang.sh: a `delta-apply --then` command that makes a running SGLang
# server reload its weights from LOCAL after delta-apply patched it.
#
#   delta-apply --root /shared/weights /local/model --then /path/to/reload-sglang.sh
#
# One request:
#
#   POST /update_weights_from_disk
#        {"model_path": "<LOCAL, absolute>", "weight_version": "<HFDELTA_VERSION>"}
#
# SGLang pauses scheduling, loads the weights, flushes its radix (prefix) cache
# itself (the request's flush_cache defaults to true) and answers
# {"success": true, ...} with status 200, or status 400 and success false.
# Tested only against a stand-in HTTP server that checks the request
# (scripts/lab/engine-test.sh --fake), not against SGLang itself.
#
# The reload is skipped (exit 0) when the state file holds HFDELTA_VERSION
# from the last successful reload, unless GET /model_info reports another
# weight_version (an engine that restarted) or gets no answer at all (exit 1).
# A server without /model_info is trusted to serve what the state file says. delta-apply runs its --then
# command after a no-op too, so a failed reload is retried by the next run.
#
# Environment:
#   HFDELTA_LOCAL, HFDELTA_VERSION  set by delta-apply (required)
#   SGLANG_URL            the server (default http://127.0.0.1:30000)
#   SGLANG_TIMEOUT        seconds for the reload request (default 600)
#   SGLANG_STATE_FILE     where the served version is remembered (default
#                         ${XDG_RUNTIME_DIR:-/tmp}/hfdelta-sglang-HOST_PORT.version;
#                         never inside LOCAL, which delta-apply --verify checks)
#   SGLANG_HTTP           curl or python3 (default: curl if installed, else python3)
#
# Messages go to standard error, so that delta-apply --json keeps standard
# output to its summary.
# Exit: 0 reloaded or already serving HFDELTA_VERSION; 1 the reload failed;
# 2 usage (variables missing, no HTTP client). delta-apply reports any
# non-zero exit as its exit code 9.

me=reload-sglang

say() { echo "$me: $*" >&2; }

if [ -z "${HFDELTA_LOCAL:-}" ] || [ -z "${HFDELTA_VERSION:-}" ]; then
    say "HFDELTA_LOCAL and HFDELTA_VERSION must be set (run me from delta-apply --then)"
    exit 2
fi

url=${SGLANG_URL:-http://127.0.0.1:30000}
url=${url%/}
t_reload=${SGLANG_TIMEOUT:-600}

# HFDELTA_LOCAL is LOCAL as given to delta-apply, possibly relative to its
# working directory (ours too); the server needs an absolute path.
local_abs=$(cd "$HFDELTA_LOCAL" && pwd -P) || { say "cannot enter $HFDELTA_LOCAL"; exit 1; }

if [ -n "${SGLANG_STATE_FILE:-}" ]; then
    state=$SGLANG_STATE_FILE
else
    hostport=${url#*://}
    hostport=${hostport%%/*}
    state=${XDG_RUNTIME_DIR:-/tmp}/hfdelta-sglang-$(printf '%s' "$hostport" | tr -c 'A-Za-z0-9.-' '_').version
fi

http=${SGLANG_HTTP:-}
if [ -z "$http" ]; then
    if command -v curl >/dev/null 2>&1; then http=curl
    elif command -v python3 >/dev/null 2>&1; then http=python3
    else say "neither curl nor python3 found"; exit 2
    fi
fi
case $http in
    curl|python3) command -v "$http" >/dev/null 2>&1 || { say "SGLANG_HTTP=$http: not found"; exit 2; } ;;
    *) say "SGLANG_HTTP must be curl or python3, not $http"; exit 2 ;;
esac

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
    print(f"reload-sglang: {method} {url}: HTTP {e.code}: {body}", file=sys.stderr)
    sys.exit(3)
except Exception as e:
    print(f"reload-sglang: {method} {url}: {e}", file=sys.stderr)
    sys.exit(1)
EOF
    fi
}

json_string() { sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\1/p" | head -n 1; }

if [ "$(cat "$state" 2>/dev/null)" = "$HFDELTA_VERSION" ]; then
    # A server without /model_info (an error status) cannot say: trust the
    # state file. One that does not answer at all is a failure.
    rc=0
    info=$(request GET /model_info 10 2>/dev/null) || rc=$?
    if [ "$rc" -eq 1 ]; then
        say "$url does not answer"
        exit 1
    fi
    served=$(printf '%s\n' "$info" | json_string weight_version)
    if [ "$rc" -ne 0 ] || [ -z "$served" ] || [ "$served" = "$HFDELTA_VERSION" ]; then
        say "$url already serves version $HFDELTA_VERSION"
        exit 0
    fi
    say "$url reports weight_version $served; reloading"
fi

t_start=$(now)
path_json=$(printf '%s' "$local_abs" | sed 's/\\/\\\\/g; s/"/\\"/g')
version_json=$(printf '%s' "$HFDELTA_VERSION" | sed 's/\\/\\\\/g; s/"/\\"/g')
out=$(request POST /update_weights_from_disk "$t_reload" \
    "{\"model_path\": \"$path_json\", \"weight_version\": \"$version_json\"}") \
    || { say "reload of version $HFDELTA_VERSION failed"; exit 1; }
case $out in
    *'"success"'*true*) ;;
    *) say "reload of version $HFDELTA_VERSION failed: $out"; exit 1 ;;
esac

tmp=$state.tmp.$$
if printf '%s\n' "$HFDELTA_VERSION" > "$tmp" && mv -f "$tmp" "$state"; then :; else
    rm -f "$tmp"
    say "reloaded, but cannot write $state (the next run reloads again)"
fi
say "version $HFDELTA_VERSION reloaded from $local_abs in $(since "$t_start") s"
exit 0
