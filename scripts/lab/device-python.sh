#!/usr/bin/env bash
# The Python package on a GPU machine whose Python is not this machine's (no network there, no
# Debian build dependencies, its own Python and torch): the library, its CUDA path and the CLIs
# are built here (BUILDDIR, set up with -Dcuda=enabled), and only what depends on that Python
# (nanobind and the bindings of python/src) is compiled there, against its headers.
#
#   scripts/lab/device-python.sh --prepare [BUILDDIR]   here: .devpy/ (git-ignored) with the
#       library's and cuda/'s objects, delta-diff, delta-apply, hfdelta-gen, the shared libraries
#       beyond libc they need, nanobind's sources, and the headers of Debian's packages the bindings
#       include (Boost, nlohmann/json, zstd, xxHash; the C and C++ headers are the machine's own)
#   scripts/lab/device-python.sh --build                there: .devpy/pkg/hfdelta, importable
#       with PYTHONPATH=.devpy/pkg (prints the commands' output on failure)
#   scripts/lab/device-python.sh --sharded-bench "1 2 4 8 16"   there, after --build: a pair of
#       the qwen3-0.6b preset generated, then scripts/bench/sharded.py over those rank counts
#   scripts/lab/device-python.sh --cuda-test            there, after --build: tests/python's
#       CUDA Publisher test (test_publisher_cuda.py) on the GPU
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
dp=$repo/.devpy

if [ "${1:-}" = --prepare ]; then
  b=${2:-build-cuda}
  ninja -C "$b" src/libhfdelta.a cuda/libhfdelta-cuda.a src/delta-diff src/delta-apply tools/hfdelta-gen
  rm -rf "$dp"
  mkdir -p "$dp/obj" "$dp/lib" "$dp/bin" "$dp/sys" "$dp/nanobind"
  cp "$b"/src/libhfdelta.a.p/*.o "$dp/obj/"
  for o in "$b"/cuda/libhfdelta-cuda.a.p/*.o; do cp "$o" "$dp/obj/cuda_$(basename "$o")"; done
  cp "$b/src/delta-diff" "$b/src/delta-apply" "$b/tools/hfdelta-gen" "$dp/bin/"
  . scripts/lab/carry.sh
  carry_libs "$dp/lib" "$dp"/bin/*
  for l in libzstd libxxhash libboost_filesystem libgomp; do  # link names for the module
    f=$(ls "$dp"/lib/$l.so.* | head -1)
    ln -sf "$(basename "$f")" "$dp/lib/$l.so"
  done
  nb=$(python3 -c 'import nanobind, os; print(os.path.dirname(nanobind.include_dir()))' 2>/dev/null ||
    /work/engine-venv/bin/python -c 'import nanobind, os; print(os.path.dirname(nanobind.include_dir()))')
  cp -r "$nb"/include "$nb"/src "$nb"/ext "$dp/nanobind/"
  # The system headers the bindings include (their dependency lists, Python's own left out).
  pyinc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  for s in python/src/*.cpp; do
    g++ -std=c++20 -M -DHFDELTA_CUDA -I include -I cuda -I "$pyinc" -I "$nb/include" -I "$nb/ext/robin_map/include" "$s"
  done | tr ' \\' '\n\n' | grep -E '^/usr/include/(boost/|nlohmann/|zstd|zdict|xxhash)' | sort -u | while read -r h; do
    mkdir -p "$dp/sys/$(dirname "${h#/usr/include/}")"
    cp "$h" "$dp/sys/${h#/usr/include/}"
  done
  carry_ignored .devpy
  du -sh "$dp"
  exit 0
fi

export LD_LIBRARY_PATH="$dp/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ "${1:-}" = --build ]; then
  py=${PYTHON:-python3}
  pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  cuda=${CUDA_HOME:-/usr/local/cuda}
  mkdir -p "$dp/build" "$dp/pkg/hfdelta"
  nbf=(-I "$dp/nanobind/include" -I "$dp/nanobind/ext/robin_map/include" -I "$pyinc")
  common=(-std=c++20 -O2 -fPIC -fvisibility=hidden -DNDEBUG -fopenmp -DBOOST_FILESYSTEM_DYN_LINK=1 -DBOOST_ALL_NO_LIB)
  g++ "${common[@]}" "${nbf[@]}" -DNB_BUILD -fno-strict-aliasing -w -c "$dp/nanobind/src/nb_combined.cpp" \
    -o "$dp/build/nb.o" &
  for s in python/src/*.cpp; do
    g++ "${common[@]}" "${nbf[@]}" -I include -I cuda -I "$cuda/include" -isystem "$dp/sys" -DHFDELTA_CUDA \
      '-DHFDELTA_PY_VERSION="device"' -c "$s" -o "$dp/build/$(basename "$s" .cpp).o" &
  done
  wait
  g++ -shared -o "$dp/pkg/hfdelta/_core$ext" "$dp"/build/*.o "$dp"/obj/*.o -L "$dp/lib" -lzstd -lxxhash \
    -lboost_filesystem -fopenmp -L "$cuda/lib64" -lcudart_static -ldl -lrt -lpthread -Wl,-rpath,"$dp/lib"
  cp python/hfdelta/*.py python/hfdelta/_core.pyi python/hfdelta/py.typed "$dp/pkg/hfdelta/"
  PYTHONPATH=$dp/pkg "$py" -c 'import hfdelta, hfdelta._core as c; print("hfdelta", hfdelta.__version__, "cuda", c.cuda)'
  exit 0
fi

export PYTHONPATH=$dp/pkg${PYTHONPATH:+:$PYTHONPATH}
export HFDELTA_DIFF=$dp/bin/delta-diff HFDELTA_APPLY=$dp/bin/delta-apply HFDELTA_GEN=$dp/bin/hfdelta-gen
if [ "${1:-}" = --sharded-bench ]; then
  work=${TMPDIR:-/tmp}/hfdelta-sharded
  rm -rf "$work"
  "$HFDELTA_GEN" --preset qwen3-0.6b --saves 1 --lr 1e-6 "$work/series" >/dev/null
  python3 scripts/bench/sharded.py "$work/series/save_000" "$work/series/save_001" "$work/sharded.json" \
    --ranks "${2:-1 2 4 8 16}" --delta-diff "$HFDELTA_DIFF"
  cp "$work/sharded.json" "${OUT:-.}/" 2>/dev/null || true
  exit 0
fi
if [ "${1:-}" = --cuda-test ]; then
  python3 -m pytest -q -p no:cacheprovider -rs tests/python/test_publisher_cuda.py
  exit $?
fi
echo "usage: $0 --prepare [BUILDDIR] | --build | --sharded-bench \"RANKS\" | --cuda-test" >&2
exit 2
