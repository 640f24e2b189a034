# shellcheck shell=sh disable=SC2034,SC2154  # variables the sourcing script sets and uses
# reload-common.sh: what contrib/reload-*.sh share, sourced by each from the
# directory it is in: install it beside them. Not a command of its own.
#
# The sourcing script sets first:
#   me              its name in messages (reload-vllm)
#   vars            the prefix of its variables (VLLM), for messages
#   http            the HTTP client asked for (${VLLM_HTTP:-})
# and, to reload several servers (setup_replicas, then reload_all):
#   urls            the servers, separated by spaces, newlines or commas
#   state_file_env  the one state file asked for (${VLLM_STATE_FILE:-})
#   state_dir       where each server's state file is otherwise
#   state_name      the engine in state file names: hfdelta-NAME-HOST_PORT.version
# and defines reload_one URL (0: reloaded or skipped; 1: failed, the step in
# $failed_step) and, if a signal must undo something, on_stop.

# The server being reloaded, and whether to name it in messages (several).
url=
tag=

say() { echo "$me: $tag$*" >&2; }

# say_url TEXT: about the server being reloaded; names it unless the tag does.
say_url() { if [ -n "$tag" ]; then say "$*"; else say "$url $*"; fi; }

need_hfdelta_env() {
    if [ -z "${HFDELTA_LOCAL:-}" ] || [ -z "${HFDELTA_VERSION:-}" ]; then
        say "HFDELTA_LOCAL and HFDELTA_VERSION must be set (run me from delta-apply --then)"
        exit 2
    fi
}

# need_local_abs: LOCAL in $local_abs. HFDELTA_LOCAL is LOCAL as given to
# delta-apply, possibly relative to its working directory (ours too); the
# server needs an absolute path.
need_local_abs() {
    local_abs=$(cd "$HFDELTA_LOCAL" && pwd -P) || { say "cannot enter $HFDELTA_LOCAL"; exit 1; }
}

# need_http: $http checked, or curl (else python3) chosen when it is empty.
need_http() {
    if [ -z "$http" ]; then
        if command -v curl >/dev/null 2>&1; then http=curl
        elif command -v python3 >/dev/null 2>&1; then http=python3
        else say "neither curl nor python3 found"; exit 2
        fi
    fi
    case $http in
        curl|python3) command -v "$http" >/dev/null 2>&1 || { say "${vars}_HTTP=$http: not found"; exit 2; } ;;
        *) say "${vars}_HTTP must be curl or python3, not $http"; exit 2 ;;
    esac
}

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
        python3 - "$1" "$url$2" "$3" "${4-}" "$me" <<'PY'
import signal, sys, urllib.request, urllib.error
method, url, timeout, data, me = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
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
    print(f"{me}: {method} {url}: HTTP {e.code}: {body}", file=sys.stderr)
    sys.exit(3)
except Exception as e:
    print(f"{me}: {method} {url}: {e}", file=sys.stderr)
    sys.exit(1)
PY
    fi
}

# json_string KEY: the string value of KEY in the JSON object on standard input.
json_string() { sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\1/p" | head -n 1; }
# json_quote TEXT: TEXT as a JSON string's contents.
json_quote() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }

# --- several servers, one after another ------------------------------------

# setup_replicas: the checks before any request (exit 2, or 1 for LOCAL);
# sets urls (split), n_urls, local_abs, http and path_json.
setup_replicas() {
    need_hfdelta_env
    set -f   # the URL list is split on blanks; no globbing
    urls=$(printf '%s\n' "$urls" | tr ',' ' ')
    n_urls=0
    for u in $urls; do n_urls=$((n_urls + 1)); done
    if [ "$n_urls" -eq 0 ]; then
        say "${vars}_URLS names no server"
        exit 2
    fi
    if [ "$n_urls" -gt 1 ] && [ -n "$state_file_env" ]; then
        say "${vars}_STATE_FILE names one file for $n_urls servers; set ${vars}_STATE_DIR instead"
        exit 2
    fi
    need_local_abs
    need_http
    path_json=$(json_quote "$local_abs")
}

# state_file URL: where the version URL serves is remembered.
state_file() {
    if [ -n "$state_file_env" ]; then
        printf '%s\n' "$state_file_env"
    else
        _hp=${1#*://}
        _hp=${_hp%%/*}
        printf '%s/hfdelta-%s-%s.version\n' "$state_dir" "$state_name" \
            "$(printf '%s' "$_hp" | tr -c 'A-Za-z0-9.-' '_')"
    fi
}

# reloaded: the version written to $state, for the next run's skip, and the
# reload since $t_start reported.
reloaded() {
    _tmp=$state.tmp.$$
    if printf '%s\n' "$HFDELTA_VERSION" > "$_tmp" && mv -f "$_tmp" "$state"; then :; else
        rm -f "$_tmp"
        say "reloaded, but cannot write $state (the next run reloads again)"
    fi
    say "version $HFDELTA_VERSION reloaded from $local_abs in $(since "$t_start") s"
}

# on_stop: what a signal undoes before the script exits (redefined by the script).
on_stop() { :; }

# A signal stops the run: no further server is started. A second signal
# while on_stop runs is ignored.
# shellcheck disable=SC2317  # run by the traps
replicas_interrupted() {
    trap '' HUP INT TERM
    on_stop
    tag=
    # shellcheck disable=SC2086  # the list, split
    say "interrupted (signal $1): version $HFDELTA_VERSION not reloaded on:$(printf ' %s' $left)"
    exit $((128 + $1))
}

# reload_all: reload_one for each server, then exit 0 (all served) or 1.
reload_all() {
    left=$urls
    trap 'replicas_interrupted 1' HUP
    trap 'replicas_interrupted 2' INT
    trap 'replicas_interrupted 15' TERM
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
}
