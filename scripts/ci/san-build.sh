#!/usr/bin/env bash
# Configures and builds build-san/: the one clang build with AddressSanitizer,
# UndefinedBehaviorSanitizer (non-recovering), libstdc++ bounds checks and
# libFuzzer's coverage instrumentation (-Dfuzz=enabled). scripts/ci/sanitize.sh
# runs the test suite in it and scripts/ci/fuzz.sh links the libFuzzer targets
# against the same library, so CI compiles the project twice in all (this and
# the release build), not three times.
#
# Usage: scripts/ci/san-build.sh [ninja targets]   (none: everything built by default)
set -euo pipefail
cd "$(dirname "$0")/../.."

scripts/setup.sh

# clang, its sanitizer and libFuzzer runtimes, and its OpenMP (the library uses OpenMP).
packages=(clang-14 libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
  echo "san-build: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if command -v clang++-14 >/dev/null; then
  cc=clang-14 cxx=clang++-14
else
  cc=clang cxx=clang++
fi

builddir=build-san
# UBSan's object-size check, which AddressSanitizer's bounds checks cover,
# keeps clang 14 from inlining the standard library's accessors
# (vector::operator[], size()): left in, the sanitized unit tests took 229 s
# against 182 s without it.
no_object_size=(-Dc_args=-fno-sanitize=object-size -Dcpp_args=-fno-sanitize=object-size)
# The CUDA path (cuda/) is compiled by nvcc in the release build; this clang
# build leaves it out (-Dcuda=disabled): nvcc's objects are not instrumented,
# and its programs would not link against clang's OpenMP and sanitizer runtimes.
if [ -f "$builddir/build.ninja" ]; then
  meson setup --reconfigure "$builddir" -Dcuda=disabled "${no_object_size[@]}" >/dev/null
else
  # -O1, as the sanitizers' own documentation suggests: it compiles in about
  # half the time of -O2.
  # -Dunity=off: CI's one build that compiles every .cpp on its own, so a file
  # that compiles only after another one's includes is caught.
  CC=$cc CXX=$cxx meson setup "$builddir" -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=debugoptimized -Doptimization=1 -Dunity=off -Dtests=enabled -Dfuzz=enabled -Dcuda=disabled \
    "${no_object_size[@]}" >/dev/null
fi
start=$(date +%s)
# No ccache here: nothing else is built with these flags, so in CI every
# lookup would miss and only add its cost.
CCACHE_DISABLE=1 ninja -C "$builddir" "$@"
echo "san-build: built ${*:-the default targets} in $(($(date +%s) - start)) s"
