#!/usr/bin/env bash
# The Python package (pyproject.toml, python/): installs it fresh into a virtual
# environment, builds its wheel, and runs its tests (tests/python) against the
# CLIs of the meson build, which must be built already (scripts/test.sh does).
#   1. a virtual environment in BUILDDIR/py-venv, made with the python3 on PATH,
#      with the tests' packages (numpy safetensors ml_dtypes pytest mypy), and
#      torch and transformers for the sharded publisher's tests (HFDELTA_TEST_TORCH=0: not)
#   2. pip install . : meson-python builds the library, hfdelta._core and the CLIs
#      from scratch (in BUILDDIR-pip, emptied first: as deep as BUILDDIR, so
#      that ccache, where scripts/test.sh set it up, finds BUILDDIR's objects
#      under the same relative paths); where nvcc is found
#      (CUDACXX, else PATH), with the CUDA path that a plain `pip install .`
#      leaves out (-Csetup-args=-Dcuda=enabled), so that the package's device
#      code is compiled and tests/python/test_publisher_cuda.py runs on a GPU
#   3. pip wheel . --no-deps into BUILDDIR/py-wheel (reusing that build): one .whl
#   4. pytest tests/python (printing its 8 slowest tests), with HFDELTA_DIFF, HFDELTA_APPLY, HFDELTA_GEN set to
#      the binaries of BUILDDIR (src/, tools/), as for the e2e tests
# Usage: scripts/ci/python-test.sh [extra pytest arguments]
# Exit status: the first step that failed (pytest's 5, no test collected, included).
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
builddir=${HFDELTA_BUILDDIR:-build}
venv=$repo/$builddir/py-venv
bin=$repo/$builddir/src
gen=$repo/$builddir/tools/hfdelta-gen

step() {  # step NAME COMMAND...: runs it, says how long it took, stops the script if it failed
  local name=$1
  shift
  local start=$SECONDS
  echo "---- $name"
  "$@"
  local rc=$?
  echo "---- $name: exit $rc, $((SECONDS - start)) s"
  if [ "$rc" -ne 0 ]; then exit "$rc"; fi
}

for tool in "$bin/delta-diff" "$bin/delta-apply" "$gen"; do
  if [ ! -x "$tool" ]; then
    echo "python-test: $tool is not built (meson setup $builddir && ninja -C $builddir)" >&2
    exit 1
  fi
done

make_venv() {
  if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv" || return 1; fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check numpy safetensors ml_dtypes pytest mypy
}
# torch and transformers for the sharded publisher's tests (tests/python/test_sharded.py: real
# torch.distributed processes, FSDP2 of a transformers Qwen3 model); PyPI's torch, about 4 GB with
# its CUDA libraries, 1.5 min to install here. HFDELTA_TEST_TORCH=0 leaves them out (those tests
# then skip, saying why).
add_torch() {
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch>=2.6" transformers
}
step "virtual environment ($venv, $(python3 --version 2>&1))" make_venv
if [ "${HFDELTA_TEST_TORCH:-1}" != 0 ]; then step "torch and transformers (for the sharded publisher's tests)" add_torch; fi

pip=("$venv/bin/python" -m pip --disable-pip-version-check)
pybuild=$repo/$builddir-pip
build_args=(-Cbuild-dir="$pybuild")
with_cuda=
nvcc=${CUDACXX:-nvcc}
if command -v "${nvcc##* }" >/dev/null 2>&1; then
  build_args+=(-Csetup-args=-Dcuda=enabled)
  with_cuda=" with CUDA (-Dcuda=enabled)"
fi
install_fresh() {
  rm -rf "$pybuild"
  "${pip[@]}" uninstall -q -y hfdelta >/dev/null 2>&1
  if command -v ccache >/dev/null; then ccache -z >/dev/null; fi
  "${pip[@]}" install -q . "${build_args[@]}" || return 1
  if command -v ccache >/dev/null; then
    echo "ccache, this build: $(ccache -s | grep -E '^ +Hits:' | head -1 | tr -s ' ')"
  fi
}
step "pip install .$with_cuda" install_fresh

build_wheel() {
  rm -rf "$repo/$builddir/py-wheel"
  "${pip[@]}" wheel -q . --no-deps -w "$repo/$builddir/py-wheel" "${build_args[@]}" || return 1
  local wheels=("$repo/$builddir/py-wheel"/hfdelta-*.whl)
  if [ ! -f "${wheels[0]}" ]; then
    echo "python-test: pip wheel made no hfdelta-*.whl in $builddir/py-wheel" >&2
    return 1
  fi
  echo "wheel: ${wheels[0]#"$repo/"} ($(du -k "${wheels[0]}" | cut -f1) KiB)"
}
step "pip wheel .$with_cuda" build_wheel

run_pytest() {
  HFDELTA_DIFF=$bin/delta-diff HFDELTA_APPLY=$bin/delta-apply HFDELTA_GEN=$gen \
    "$venv/bin/pytest" -p no:cacheprovider -rfEs --durations=8 "$repo/tests/python" "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then echo "python-test: pytest collected no test" >&2; fi
  return "$rc"
}
step "pytest tests/python" run_pytest "$@"
