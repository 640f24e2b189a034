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
# Several SGLang servers on one host serving the same LOCAL (replicas): list
# their URLs in SGLANG_URLS. They are reloaded one after another, each
# reload answered before the next is sent. A replica whose reload fails is
# reported (its URL) and the others are still reloaded; the script then
# exits 1 naming the replicas that failed. Each replica has its own state
# file, so the next run reloads only those that do not serve the version yet.
#
# A stop (systemctl stop): delta-apply passes its SIGTERM (SIGINT, SIGHUP) on
# to this script's process group, so the request under way ends at once and
# the script exits 128+N. It paused nothing: SGLang pauses and resumes its
# own scheduling around a reload, which goes on (or fails) without the
# client, so there is nothing to resume here.
#
# Environment:
#   HFDELTA_LOCAL, HFDELTA_VERSION  set by delta-apply (required)
#   SGLANG_URLS           the servers, separated by spaces, newlines or commas
#                         (default: SGLANG_URL)
#   SGLANG_URL            the server when SGLANG_URLS is unset (default
#                         http://127.0.0.1:30000)
#   SGLANG_TIMEOUT        seconds for the reload request (default 600)
#   SGLANG_STATE_DIR      where each server's version is remembered, in
#                         hfdelta-sglang-HOST_PORT.version (default
#                         ${XDG_RUNTIME_DIR:-/tmp}; never inside LOCAL, which
#                         delta-apply --verify checks)
#   SGLANG_STATE_FILE     the state file itself; only with a single server
#   SGLANG_HTTP           curl or python3 (default: curl if installed, else python3)
#
# Messages go to standard error, so that delta-apply --json keeps standard
# output to its summary; with several servers each line names the server.
# Exit: 0 every server reloaded or already serving HFDELTA_VERSION; 1 the
# reload failed on one server or more (the messages name each); 2 usage
# (variables missing, no HTTP client, SGLANG_STATE_FILE with several
# servers); 128+N killed by signal N (no further server was started).
# delta-apply reports any non-zero exit as its exit code 9.

me=reload-sglang

# The server being reloaded, and whether to name it in messages (several).
url=
tag=

say() { echo "$me: $tag$*" >&2; }

if [ -z "${HFDELTA_LOCAL:-}" ] || [ -z "${HFDELTA_VERSION:-}" ]; then
    say "HFDELTA_LOCAL and HFDELTA_VERSION must be set (run me from delta-apply --then)"
    exit 2
fi

set -f   # the URL list is split on blanks; no globbing
urls=$(printf '%s\n' "${SGLANG_URLS:-${SGLANG_URL:-http://127.0.0.1:30000}}" | tr ',' ' ')
n_urls=0
for u in $urls; do n_urls=$((n_urls + 1)); done
if [ "$n_urls" -eq 0 ]; then
    say "SGLANG_URLS names no server"
    exit 2
fi
if [ "$n_urls" -gt 1 ] && [ -n "${SGLANG_STATE_FILE:-}" ]; then
    say "SGLANG_STATE_FILE names one file for $n_urls servers; set SGLANG_STATE_DIR instead"
    exit 2
fi
t_reload=${SGLANG_TIMEOUT:-600}

# HFDELTA_LOCAL is LOCAL as given to delta-apply, possibly relative to its
# working directory (ours too); the server needs an absolute path.
local_abs=$(cd "$HFDELTA_LOCAL" && pwd -P) || { say "cannot enter $HFDELTA_LOCAL"; exit 1; }

# state_file URL: where the version URL serves is remembered.
state_file() {
    if [ -n "${SGLANG_STATE_FILE:-}" ]; then
        printf '%s\n' "$SGLANG_STATE_FILE"
    else
        _hp=${1#*://}
        _hp=${_hp%%/*}
        printf '%s/hfdelta-sglang-%s.version\n' "${SGLANG_STATE_DIR:-${XDG_RUNTIME_DIR:-/tmp}}" \
            "$(printf '%s' "$_hp" | tr -c 'A-Za-z0-9.-' '_')"
    fi
}

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
        python3 - "$1" "$url$2" "$3" "${4-}" <<'PY'
import signal, sys, urllib.request, urllib.error
method, url, timeout, data = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
# The whole request within TIMEOUT, as curl's --max-time (urllib's timeout is per socket operation).
def expired(*_):
    raise TimeoutError(f"no answer within {timeout:g} s")
signal.signal(signal.SIGALRM, expired)
signal.setitimer(signal.ITIMER_REAL, timeout)
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
PY
    fi
}

json_string() { sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\1/p" | head -n 1; }

path_json=$(printf '%s' "$local_abs" | sed 's/\\/\\\\/g; s/"/\\"/g')
version_json=$(printf '%s' "$HFDELTA_VERSION" | sed 's/\\/\\\\/g; s/"/\\"/g')

# reload_one URL: reload one server (or skip it); 1 when it failed, the
# step (model_info or update_weights_from_disk) in $failed_step.
reload_one() {
    url=${1%/}
    failed_step=
    state=$(state_file "$url")
    if [ "$(cat "$state" 2>/dev/null)" = "$HFDELTA_VERSION" ]; then
        # A server without /model_info (an error status) cannot say: trust the
        # state file. One that does not answer at all is a failure.
        _rc=0
        info=$(request GET /model_info 10 2>/dev/null) || _rc=$?
        if [ "$_rc" -eq 1 ]; then
            failed_step=model_info
            if [ -n "$tag" ]; then say "does not answer"; else say "$url does not answer"; fi
            return 1
        fi
        served=$(printf '%s\n' "$info" | json_string weight_version)
        if [ "$_rc" -ne 0 ] || [ -z "$served" ] || [ "$served" = "$HFDELTA_VERSION" ]; then
            if [ -n "$tag" ]; then say "already serves version $HFDELTA_VERSION"
            else say "$url already serves version $HFDELTA_VERSION"; fi
            return 0
        fi
        if [ -n "$tag" ]; then say "reports weight_version $served; reloading"
        else say "$url reports weight_version $served; reloading"; fi
    fi

    t_start=$(now)
    failed_step=update_weights_from_disk
    out=$(request POST /update_weights_from_disk "$t_reload" \
        "{\"model_path\": \"$path_json\", \"weight_version\": \"$version_json\"}") \
        || { say "reload of version $HFDELTA_VERSION failed"; return 1; }
    case $out in
        *'"success"'*true*) ;;
        *) say "reload of version $HFDELTA_VERSION failed: $out"; return 1 ;;
    esac
    failed_step=

    _tmp=$state.tmp.$$
    if printf '%s\n' "$HFDELTA_VERSION" > "$_tmp" && mv -f "$_tmp" "$state"; then :; else
        rm -f "$_tmp"
        say "reloaded, but cannot write $state (the next run reloads again)"
    fi
    say "version $HFDELTA_VERSION reloaded from $local_abs in $(since "$t_start") s"
}

# A signal stops the run: no further server is started.
left=$urls
# shellcheck disable=SC2317  # run by the traps
on_signal() {
    trap '' HUP INT TERM
    tag=
    # shellcheck disable=SC2086  # the list, split
    say "interrupted (signal $1): version $HFDELTA_VERSION not reloaded on:$(printf ' %s' $left)"
    exit $((128 + $1))
}
trap 'on_signal 1' HUP
trap 'on_signal 2' INT
trap 'on_signal 15' TERM

failed=
n_failed=0
for u in $urls; do
    [ "$n_urls" -gt 1 ] && tag="${u%/}: "
    if ! reload_one "$u"; then
        failed="$failed ${u%/} ($failed_step)"
        n_failed=$((n_failed + 1))
    fi
    left=${left#*"$u"}
done
tag=
if [ "$n_failed" -gt 0 ]; then
    say "version $HFDELTA_VERSION not reloaded on $n_failed of $n_urls server(s):$failed"
    exit 1
fi
[ "$n_urls" -gt 1 ] && say "version $HFDELTA_VERSION served by all $n_urls servers"
exit 0
