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
vars=SGLANG
urls=${SGLANG_URLS:-${SGLANG_URL:-http://127.0.0.1:30000}}
state_file_env=${SGLANG_STATE_FILE:-}
state_dir=${SGLANG_STATE_DIR:-${XDG_RUNTIME_DIR:-/tmp}}
state_name=sglang
http=${SGLANG_HTTP:-}
t_reload=${SGLANG_TIMEOUT:-600}

# The shared part, beside this script (or beside the file a link to it names).
common=$(dirname "$0")/reload-common.sh
[ -r "$common" ] || common=$(dirname "$(readlink -f "$0")")/reload-common.sh
[ -r "$common" ] || { echo "$me: $common not found: install it beside $0" >&2; exit 2; }
# shellcheck source-path=SCRIPTDIR source=reload-common.sh
. "$common"

setup_replicas
version_json=$(json_quote "$HFDELTA_VERSION")

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
            say_url "does not answer"
            return 1
        fi
        served=$(printf '%s\n' "$info" | json_string weight_version)
        if [ "$_rc" -ne 0 ] || [ -z "$served" ] || [ "$served" = "$HFDELTA_VERSION" ]; then
            say_url "already serves version $HFDELTA_VERSION"
            return 0
        fi
        say_url "reports weight_version $served; reloading"
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
    reloaded
}

# A signal stops the run (reload_all): SGLang paused nothing of ours.
reload_all
