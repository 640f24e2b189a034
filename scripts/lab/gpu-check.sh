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
#   scripts/lab/gpu-check.sh --prepare [BUILDDIR]   here: builds hfdelta-gpu-check in BUILDDIR
#                                                   (default build-cuda, set up with -Dcuda=enabled)
#                                                   and copies it to .gpu/ with the shared
#                                                   libraries beyond libc and libstdc++ it needs
#   scripts/lab/gpu-check.sh [ARGS]                 there: runs .gpu/hfdelta-gpu-check: each design's
#                                                   identity checks, then the throughput table of
#                                                   512 MiB tensors (ARGS: one run with those
#                                                   arguments instead, e.g. --identity --design select,
#                                                   --throughput --mib 256)
#   scripts/lab/gpu-check.sh --profile              there: Nsight Compute (ncu) over one row of the table
#                                                   (BF16 at 1%, 256 MiB, sparse's find by tiles and
#                                                   tilesw, and the read floor): its text report of
#                                                   speed of light, memory, occupancy, warp states and
#                                                   launch; within 110 s; without ncu it says so and runs
#                                                   the row alone
# GPU_CHECK_SECONDS (default 270): the time all parts of a check may take.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-}" = --prepare ]; then
  build=${2:-build-cuda}
  ninja -C "$build" cuda/hfdelta-gpu-check
  rm -rf .gpu
  mkdir -p .gpu/lib
  cp "$build/cuda/hfdelta-gpu-check" .gpu/
  . scripts/lab/carry.sh
  carry_libs .gpu/lib .gpu/hfdelta-gpu-check
  carry_ignored .gpu
  ls -l .gpu .gpu/lib
  du -sh .gpu
  exit 0
fi

bin=.gpu/hfdelta-gpu-check
if [ ! -x "$bin" ]; then
  echo "FAIL: $bin is missing: run scripts/lab/gpu-check.sh --prepare where the project builds, and carry .gpu"
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ "${1:-}" = --profile ]; then
  # The kernels of one row under Nsight Compute: the read floor (2 launches),
  # tiles' and tilesw's sparse find (2 each), caches flushed before each
  # (ncu's default), clocks left as they run.
  row=(--throughput --only bf16-1 --mib 256 --reps 1 --sparse --design "tiles,tilesw")
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
  if [ -z "$ncu" ]; then
    echo "NO PROFILE: ncu (Nsight Compute) is not on this machine; the row alone:"
    r=0
    timeout 110 "$bin" "${row[@]}" || r=$?
    exit $r
  fi
  echo "== $ncu ($("$ncu" --version 2>&1 | tail -1 || true)) on hfdelta-gpu-check ${row[*]}"
  r=0
  timeout 110 "$ncu" --clock-control none -k 'regex:find_tiles|read_tiles' -c 6 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
    "$bin" "${row[@]}" || r=$?
  case $r in
    0) echo "PROFILE: done" ;;
    124) echo "PROFILE: ncu ran past 110 s" ;;
    *) echo "PROFILE: ncu exit $r" ;;
  esac
  exit $r
fi

# Each design's identity checks in a process of its own (the default first; the newest after the table), then the throughput
# table of all designs in one; if that process dies (a fault leaves CUDA
# unusable in it), the table again, one process per design. Every part
# runs whatever an earlier one did; the exit status is the worst.
# The newest designs (tilesw64, tilesw4) last: their identity checks after
# the table, so that running out of time there hides no earlier result.
designs="tilesw tiles tiles16 select tiles64 tilesw64 tilesw4"  # the default (tilesw) first
newest="tilesw64 tilesw4"
if [ $# -gt 0 ]; then
  parts=("$*")
else
  parts=()
  for d in $designs; do
    case " $newest " in *" $d "*) ;; *) parts+=("--identity --design $d") ;; esac
  done
  parts+=("--publisher" "--throughput")
  for d in $newest; do parts+=("--identity --design $d"); done
fi
budget=${GPU_CHECK_SECONDS:-270}
start=$SECONDS
rc=0
for part in "${parts[@]}"; do
  left=$((budget - (SECONDS - start)))
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
      left=$((budget - (SECONDS - start)))
      [ "$left" -gt 10 ] || break
      echo "== hfdelta-gpu-check --throughput --design $d"
      timeout "$left" "$bin" --throughput --design "$d" || true
    done
  fi
  case $r in
    0) ;;
    77) echo "SKIP: gpu-check (no GPU)"; exit 77 ;;
    124) echo "FAIL: gpu-check ran past $budget s in: $part"; rc=1 ;;
    127) echo "FAIL: $bin does not load here:"; ldd "$bin" || true; exit 127 ;;
    *) echo "FAIL: gpu-check $part (exit $r)"; rc=1 ;;
  esac
done
[ $rc -eq 0 ] && echo "PASS: gpu-check"
exit $rc
