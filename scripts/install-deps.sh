#!/usr/bin/env bash
# Installs everything torch_cgx needs on a fresh Debian machine: build tools and GoogleTest from
# apt, the pinned CPU torch and the Python tools from pip. Safe to run again.
set -euo pipefail
PY=${PY:-python3}

# clang + libclang-rt-14-dev (libFuzzer, a recommends of clang that an install without
# recommends would skip): make fuzz-short.
apt_pkgs=(cmake ninja-build g++ libgtest-dev iproute2 clang libclang-rt-14-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# torch first and pinned, so nothing below can pull a newer (CUDA) build.
$PY -m pip install -q torch==2.13.0
$PY -m pip install -q -r requirements-dev.txt -c constraints.txt
