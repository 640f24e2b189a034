#!/usr/bin/env bash
# Installs everything hfdelta needs to build and test, from Debian packages.
# Idempotent, non-interactive; run as root (or with sudo available).
set -euo pipefail

packages=(
  build-essential meson ninja-build pkg-config cmake
  nlohmann-json3-dev libxxhash-dev libzstd-dev libboost-filesystem-dev
  libcli11-dev doctest-dev
  zstd xxhash
  xfsprogs  # tests: copy-on-write clones on a loop-mounted XFS
  bindfs fuse3  # tests/e2e_publish.cpp: a FUSE filesystem without rename flags, as NFS
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

SUDO=
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
