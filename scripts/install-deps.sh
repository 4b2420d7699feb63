#!/usr/bin/env bash
# Installs everything torch_cgx needs on a fresh Debian machine: build tools, GoogleTest, clang and
# Open MPI from apt, the pinned CPU torch and the Python tools from pip. Safe to run again.
#   PY=python3 scripts/install-deps.sh
# PY (default python3) is the interpreter to install into, unless it is externally managed
# (PEP 668: Debian 12's /usr/bin/python3 refuses pip): then the packages go into a virtual
# environment, .venv in the repository root, made from it (scripts/pick-python.sh decides; the
# Makefile runs everything with the same choice).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=pick-python.sh
. "$ROOT/scripts/pick-python.sh"
BASE=${PY:-python3}
PY=$(cgx_pick_python "$BASE" "$ROOT")

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
updated=""
apt_install() { # the packages not installed yet
  local missing=() p
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  [ -n "$updated" ] || { $SUDO apt-get update -qq && updated=1; }
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
}

# openmpi-bin: mpirun, for tests/test_mpirun.py (the README's `mpirun ... no shim needed`).
# For Debian's own python3 (the venv case): python3-venv (`python3 -m venv` with pip in it:
# Debian ships ensurepip apart) and python3-dev (Python.h, for the extension's build).
apt_pkgs=(cmake ninja-build g++ libgtest-dev iproute2 clang openmpi-bin)
[ "$PY" = "$BASE" ] || apt_pkgs+=(python3-venv python3-dev)
apt_install "${apt_pkgs[@]}"

# libFuzzer (make fuzz-short) is in libclang-rt-N-dev, N the major version of the clang just
# installed (14 on Debian 12): a recommends of clang that an install without
# recommends skips.
clang_major=$({ clang --version 2>/dev/null || true; } | sed -n 's/.*clang version \([0-9][0-9]*\).*/\1/p' | head -n 1)
if [ -n "$clang_major" ] && apt-cache show "libclang-rt-$clang_major-dev" >/dev/null 2>&1; then
  apt_install "libclang-rt-$clang_major-dev"
else
  echo "install-deps: apt has no libclang-rt-${clang_major:-?}-dev for this clang;" \
    "install clang's libFuzzer yourself (make fuzz-short needs it)" >&2
fi

if [ "$PY" != "$BASE" ]; then
  # Without --system-site-packages: the venv holds exactly what requirements-dev.txt and
  # constraints.txt give, not whatever Debian's python3-* packages (older numpy, say) would
  # satisfy them with, and pip never mixes its files with apt's.
  echo "install-deps: $BASE is externally managed (PEP 668): installing into $ROOT/.venv"
  "$PY" -m pip --version >/dev/null 2>&1 || "$BASE" -m venv --clear "$ROOT/.venv"
  # ensurepip's setuptools (66 on Debian 12) makes editable installs only with wheel.
  "$PY" -m pip install -q "setuptools>=64" wheel -c "$ROOT/constraints.txt"
fi

# torch first and pinned, so nothing below can pull a newer (CUDA) build.
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q -r "$ROOT/requirements-dev.txt" -c "$ROOT/constraints.txt"
# torchao's reference quantizers (MX, NVFP4), which the float formats' tests compare bytes with:
# without its dependencies (none are needed on CPU; its own would not pin torch).
"$PY" -m pip install -q --no-deps torchao==0.18.0
