#!/usr/bin/env bash
# The CUDA path checked on a machine with a GPU (cuda/gpu_check.cpp): the
# sparse and context entries written from changes found on the device, byte
# for byte the CPU path's over generated pairs (BF16, F16, F32, F8, F64, odd
# sizes, unaligned pointers, densities 0.1-10%), then change finding's
# throughput against device-to-device cudaMemcpy and the bytes copied to the
# host against the changes. PASS/FAIL lines; exit 1 on any mismatch.
#
# The GPU machine has no network and no build dependencies, so the check is
# built here and carried there in .gpu/ (git-ignored):
#   scripts/gpu-check.sh --prepare [BUILDDIR]   here: builds hfdelta-gpu-check in BUILDDIR
#                                               (default build-cuda, set up with -Dcuda=enabled)
#                                               and copies it to .gpu/ with the shared
#                                               libraries beyond libc and libstdc++ it needs
#   scripts/gpu-check.sh [--identity] [--mib N] there: runs .gpu/hfdelta-gpu-check (N MiB
#                                               tensors for the throughput table, default 512)
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
rc=0
timeout 270 "$bin" "$@" || rc=$?
case $rc in
  0) echo "PASS: gpu-check" ;;
  77) echo "SKIP: gpu-check (no GPU)" ;;
  124) echo "FAIL: gpu-check ran past 270 s" ;;
  127) echo "FAIL: $bin does not load here:"; ldd "$bin" || true ;;
  *) echo "FAIL: gpu-check (exit $rc)" ;;
esac
exit $rc
