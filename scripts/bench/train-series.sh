#!/usr/bin/env bash
# Opt-in measurement on REAL training (not hfdelta-gen's generator): how much an
# encoding could gain by coding the changes in contexts taken from the base (each
# base element's exponent). Builds a small byte-level transformers causal LM
# (Qwen3, else Qwen2 or Llama) from a config, pre-trains it briefly on text
# this machine has, then per learning rate runs AdamW steps on the fp32 master
# weights saving a bf16 save_pretrained copy after each step, and for each
# consecutive pair of saves runs hfdelta-bench bound (order-0 bound and the
# bound given the base exponent) and delta-diff with every encoding; from the
# third save on, the bound the previous step's changed positions would give as
# a second context. Nothing is
# downloaded (HF_HUB_OFFLINE=1). Results: OUT/results.md and OUT/results.json;
# the stages' durations are printed as they end.
#
# Usage: scripts/bench/train-series.sh [OPTIONS]
#   --out DIR            output directory, replaced (default BUILDDIR/train-series)
#   --params P           model size: tiny (~0.13M), small (~25M, default), medium (~60M)
#   --pretrain-steps N   pre-training steps at lr 1e-3, batch 4x64 bytes (default 200)
#   --steps N            AdamW steps (saves after the first) per lr (default 4)
#   --lrs "A B"          learning rates, one series each (default "1e-6 1e-5")
#   any other option is passed to scripts/bench/train_series.py (--batch, --seq,
#   --threads, --seed, --text-bytes; see its --help)
# Environment: HFDELTA_BUILDDIR (default build), HFDELTA_INTEROP_VENV (default
# BUILDDIR/interop-venv: torch and transformers, made by scripts/ci/interop.sh --full).
set -euo pipefail
cd "$(dirname "$0")/../.."

builddir=${HFDELTA_BUILDDIR:-build}
venv=${HFDELTA_INTEROP_VENV:-$builddir/interop-venv}
out=$builddir/train-series
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  echo "train-series: $venv lacks torch and transformers; run scripts/ci/interop.sh --full first" >&2
  exit 1
fi
for tool in bench/hfdelta-bench src/delta-diff; do
  if [ ! -x "$builddir/$tool" ]; then
    echo "train-series: $builddir/$tool is missing; build the project first (meson setup $builddir && ninja -C $builddir)" >&2
    exit 1
  fi
done

t0=$(date +%s)
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
  "$venv/bin/python" scripts/bench/train_series.py --out "$out" --builddir "$builddir" "${args[@]}"
echo "train-series: total $(( $(date +%s) - t0 )) s"
