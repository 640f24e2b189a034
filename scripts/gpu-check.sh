#!/usr/bin/env bash
# The CUDA path checked on a machine with a GPU (cuda/gpu_check.cpp): the
# sparse and context entries written from changes found on the device, byte
# for byte the CPU path's over generated pairs (BF16, F16, F32, F8, F64, odd
# sizes, unaligned pointers, densities 0.1-10%), then change finding's
# throughput against device-to-device cudaMemcpy and the bytes copied to the
# host against the changes; and the publisher from device memory
# (DevicePublisher) against put() from host memory, version for version.
# PASS/FAIL lines; exit 1 on any mismatch.
#
# The GPU machine has no network and no build dependencies, so the check is
# built here and carried there in .gpu/ (git-ignored):
#   scripts/gpu-check.sh --prepare [BUILDDIR]   here: builds hfdelta-gpu-check in BUILDDIR
#                                               (default build-cuda, set up with -Dcuda=enabled)
#                                               and copies it to .gpu/ with the shared
#                                               libraries beyond libc and libstdc++ it needs
#   scripts/gpu-check.sh [ARGS]                 there: runs .gpu/hfdelta-gpu-check: each design's
#                                               identity checks, then the throughput table of
#                                               512 MiB tensors (ARGS: one run with those
#                                               arguments instead, e.g. --identity --design select,
#                                               --throughput --mib 256)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --prepare ]; then
  build=${2:-build-cuda}
  ninja -C "$build" cuda/hfdelta-gpu-check
  rm -rf .gpu
  mkdir -p .gpu/lib
  cp "$build/cuda/hfdelta-gpu-check" .gpu/
  ldd .gpu/hfdelta-gpu-check | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libstdc++.so* | libgcc_s.so*) ;;
      *) cp -L "$lib" .gpu/lib/ ;;
    esac
  done
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
  ls -l .gpu .gpu/lib
  du -sh .gpu
  exit 0
fi

bin=.gpu/hfdelta-gpu-check
if [ ! -x "$bin" ]; then
  echo "FAIL: $bin is missing: run scripts/gpu-check.sh --prepare where the project builds, and carry .gpu"
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Each design's identity checks in a process of its own, then the throughput
# table of all designs in one; if that process dies (a fault leaves CUDA
# unusable in it), the table again, one process per design. Every part
# runs whatever an earlier one did; the exit status is the worst.
designs="tiles tiles16 select"
if [ $# -gt 0 ]; then
  parts=("$*")
else
  parts=()
  for d in $designs; do parts+=("--identity --design $d"); done
  parts+=("--publisher" "--throughput")
fi
start=$SECONDS
rc=0
for part in "${parts[@]}"; do
  left=$((270 - (SECONDS - start)))
  if [ "$left" -le 10 ]; then
    echo "FAIL: gpu-check out of time before: $part"
    rc=1
    break
  fi
  echo "== hfdelta-gpu-check $part"
  r=0
  # shellcheck disable=SC2086
  timeout "$left" "$bin" $part || r=$?
  if [ "$part" = --throughput ] && [ "$r" -ne 0 ] && [ "$r" -ne 77 ]; then
    echo "== the throughput table died (exit $r): again, one design a process"
    for d in $designs; do
      left=$((270 - (SECONDS - start)))
      [ "$left" -gt 10 ] || break
      echo "== hfdelta-gpu-check --throughput --design $d"
      timeout "$left" "$bin" --throughput --design "$d" || true
    done
  fi
  case $r in
    0) ;;
    77) echo "SKIP: gpu-check (no GPU)"; exit 77 ;;
    124) echo "FAIL: gpu-check ran past 270 s in: $part"; rc=1 ;;
    127) echo "FAIL: $bin does not load here:"; ldd "$bin" || true; exit 127 ;;
    *) echo "FAIL: gpu-check $part (exit $r)"; rc=1 ;;
  esac
done
[ $rc -eq 0 ] && echo "PASS: gpu-check"
exit $rc
