#!/usr/bin/env bash
# Which Python torch_cgx installs into and runs with, given the one asked for (PY, default python3):
#   scripts/pick-python.sh [PY]   prints the interpreter to use (the Makefile's PY)
# or, sourced, the function cgx_pick_python PY ROOT.
#
# An "externally managed" interpreter (PEP 668: a file EXTERNALLY-MANAGED in its stdlib directory,
# as Debian 12's /usr/bin/python3 has) refuses `pip install`; for one of those the answer is the
# virtual environment ROOT/.venv/bin/python, which scripts/install-deps.sh creates. Any other
# interpreter (pyenv's, conda's, one already inside a virtual environment) is used as it is.
# An interpreter that cannot be run is printed unchanged, so that the error shows where it is used.

cgx_pick_python() {
  local base=$1 root=$2 info
  info=$("$base" -c 'import sys, sysconfig
print(int(sys.prefix != sys.base_prefix))
print(sysconfig.get_path("stdlib"))' 2>/dev/null) || {
    printf '%s\n' "$base"
    return 0
  }
  local in_venv=${info%%$'\n'*} stdlib=${info#*$'\n'}
  if [ "$in_venv" = 0 ] && [ -e "$stdlib/EXTERNALLY-MANAGED" ]; then
    printf '%s\n' "$root/.venv/bin/python"
  else
    printf '%s\n' "$base"
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  cgx_pick_python "${1:-${PY:-python3}}" "$(cd "$(dirname "$0")/.." && pwd)"
fi
