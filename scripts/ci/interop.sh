#!/usr/bin/env bash
# Proves hfdelta against the real tools: checkpoints written by the safetensors
# library (and, with --full, by torch and transformers' save_pretrained), delta
# directories read back by safetensors.safe_open, and the slime disk-delta
# layout both ways against a reference publisher/applier (tests/interop/).
#
# Usage: scripts/ci/interop.sh [--light|--full] [extra pytest arguments]
#   --light (default)  safetensors numpy ml_dtypes zstandard xxhash pytest huggingface_hub
#   --full             also torch and transformers (a few GB from PyPI), and the
#                      hfdelta Python package built from this tree (its Publisher
#                      fed torch tensors: tests/interop/test_torch_publisher.py)
#
# Makes a virtual environment under the build directory (reused when there),
# installs the packages from PyPI, builds the project if needed, runs pytest on
# tests/interop/ and exits with its status.
# Environment: HFDELTA_BUILDDIR (default build), HFDELTA_INTEROP_VENV (default
# BUILDDIR/interop-venv), PYTHON (default python3), HFDELTA_TORCH_INSTALL=lean
# (default: torch without the CUDA libraries the machine already has) or
# default (pip's ordinary install with every nvidia-* package).
set -euo pipefail
cd "$(dirname "$0")/../.."

mode=light
pytest_args=()
for a in "$@"; do
  case "$a" in
    --light) mode=light ;;
    --full) mode=full ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) pytest_args+=("$a") ;;
  esac
done

builddir=${HFDELTA_BUILDDIR:-build}
venv=${HFDELTA_INTEROP_VENV:-$builddir/interop-venv}
py=${PYTHON:-python3}
light_pkgs=(safetensors numpy ml_dtypes zstandard xxhash pytest huggingface_hub)
full_pkgs=(transformers)
t0=$(date +%s)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "interop: need root to run: $*" >&2; return 1; fi
}

# ---- build ---------------------------------------------------------------------
if [ ! -f "$builddir/build.ninja" ] || ! command -v ninja >/dev/null; then
  scripts/setup.sh
  [ -f "$builddir/build.ninja" ] || meson setup "$builddir"
fi
if ! build_log=$(ninja -C "$builddir" 2>&1); then
  echo "$build_log" | tail -40
  echo "interop: the build failed; no tests run" >&2
  exit 1
fi

# ---- virtual environment --------------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then
  if ! "$py" -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    if [ -f /etc/debian_version ]; then
      echo "interop: python3 -m venv failed; installing python3-venv and python3-pip"
      export DEBIAN_FRONTEND=noninteractive
      as_root apt-get update -qq
      as_root apt-get install -y -qq --no-install-recommends python3-venv python3-pip
    fi
    "$py" -m venv "$venv"
  fi
fi
vpy="$venv/bin/python"
pip=("$vpy" -m pip --disable-pip-version-check)
# pip install, quiet; its messages are shown only when it fails (after a lean
# torch install pip warns on every run that torch's nvidia-* requirements are
# not installed: that is the point of the lean install).
pip_install() {
  local log
  log=$(mktemp)
  if "${pip[@]}" install -q "$@" >"$log" 2>&1; then rm -f "$log"; return 0; fi
  cat "$log" >&2
  rm -f "$log"
  return 1
}

# Installs only what is missing, so a reused environment costs no download.
missing() {
  "$vpy" - "$@" <<'EOF'
import importlib.metadata as md, sys
for p in sys.argv[1:]:
    try:
        md.version(p)
    except md.PackageNotFoundError:
        print(p)
EOF
}
t_install=$(date +%s)
mapfile -t need < <(missing "${light_pkgs[@]}")
if [ ${#need[@]} -gt 0 ]; then
  echo "interop: pip install ${need[*]}"
  pip_install "${need[@]}"
fi

# torch from PyPI is the CUDA build: its wheel needs libcudart, cuBLAS, cuDNN,
# NCCL, ... at import time, and pip's ordinary install brings all of them as
# nvidia-* packages (several GB). The lean install takes the wheel without its
# dependencies, adds its pure-Python requirements, then only the nvidia-*
# packages whose libraries the machine lacks (asked of the import error, one
# at a time), and falls back to the ordinary install if that does not work.
install_torch_lean() {
  pip_install --no-deps torch
  "$vpy" - <<'EOF' > "$venv/.torch-pure-reqs"
import importlib.metadata as md
from packaging.requirements import Requirement
for r in md.requires("torch") or []:
    q = Requirement(r)
    if q.marker and not q.marker.evaluate({"extra": ""}):
        continue
    if q.name.lower().startswith(("nvidia-", "cuda-", "triton")):
        continue
    print(str(q).split(";")[0])
EOF
  mapfile -t reqs < "$venv/.torch-pure-reqs"
  [ ${#reqs[@]} -eq 0 ] || pip_install "${reqs[@]}"
  local last="" err pkg
  for _ in $(seq 1 20); do
    if err=$("$vpy" -c 'import torch; torch.ones(2, dtype=torch.bfloat16).sum()' 2>&1); then return 0; fi
    pkg=$("$vpy" - "$err" <<'EOF'
import importlib.metadata as md, re, sys
err = sys.argv[1]
m = re.search(r"lib([A-Za-z_]+?)(?:_host)?\.so[.\d]*: cannot open", err)
stem = m.group(1).lower() if m else None
if stem is None and re.search(r"undefined symbol: nccl", err):
    stem = "nccl"
names = {"cudart": "cuda-runtime", "nvrtc": "cuda-nvrtc", "cupti": "cuda-cupti", "nvjitlink": "nvjitlink",
         "cublaslt": "cublas", "cusparselt": "cusparselt"}
if stem is None:
    sys.exit(0)
want = "nvidia-" + names.get(stem, stem)
direct = [re.split(r"[ ;<>=!~\[]", r)[0] for r in (md.requires("torch") or [])]
for d in direct:
    if d.lower().startswith(want + "-cu"):
        print(d)
        break
else:
    print(want)
EOF
)
    if [ -z "$pkg" ] || [ "$pkg" = "$last" ]; then
      echo "interop: lean torch install stuck at: $(echo "$err" | tail -1)"
      return 1
    fi
    echo "interop: torch needs $pkg"
    pip_install --no-deps "$pkg" || return 1
    last=$pkg
  done
  return 1
}

if [ "$mode" = full ]; then
  if ! "$vpy" -c 'import torch' >/dev/null 2>&1; then
    if [ "${HFDELTA_TORCH_INSTALL:-lean}" = lean ] && install_torch_lean; then
      echo "interop: torch installed without the CUDA libraries this machine already has"
    else
      echo "interop: pip install torch (ordinary install, with its nvidia-* packages)"
      pip_install torch
    fi
  fi
  mapfile -t need < <(missing "${full_pkgs[@]}")
  [ ${#need[@]} -eq 0 ] || { echo "interop: pip install ${need[*]}"; pip_install "${need[@]}"; }
  # The package of this tree, rebuilt incrementally in a build directory of its own.
  echo "interop: pip install . (the hfdelta package)"
  pip_install . -Cbuild-dir="$PWD/$builddir/py-build-interop"
fi
t_tests=$(date +%s)

# ---- versions ------------------------------------------------------------------
"$vpy" - "$mode" <<'EOF'
import importlib.metadata as md, platform, sys
pkgs = ["safetensors", "numpy", "ml_dtypes", "zstandard", "xxhash", "pytest", "huggingface_hub"]
if sys.argv[1] == "full":
    pkgs += ["torch", "transformers", "tokenizers"]
vs = []
for p in pkgs:
    try:
        vs.append(f"{p} {md.version(p)}")
    except md.PackageNotFoundError:
        vs.append(f"{p} (missing)")
print(f"interop ({sys.argv[1]}): Python {platform.python_version()}, " + ", ".join(vs))
EOF
du -sh "$venv" 2>/dev/null | awk '{print "interop: environment " $2 " is " $1}'
echo "interop: setup took $((t_tests - t0)) s (packages $((t_tests - t_install)) s)"

# ---- tests ---------------------------------------------------------------------
export HFDELTA_DIFF="$PWD/$builddir/src/delta-diff"
export HFDELTA_APPLY="$PWD/$builddir/src/delta-apply"
export HFDELTA_GEN="$PWD/$builddir/tools/hfdelta-gen"
export HFDELTA_TESTDATA="$PWD/testdata"
export PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
marker=()
[ "$mode" = full ] || marker=(-m "not full")
set +e
"$vpy" -m pytest tests/interop -q "${marker[@]}" "${pytest_args[@]}"
rc=$?
set -e
echo "interop: tests took $(( $(date +%s) - t_tests )) s, $(( $(date +%s) - t0 )) s in all"
exit $rc
