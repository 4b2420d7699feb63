#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md): builds what the project has with every core and
# runs each step with its own timeout, writing report.md, report.json and logs.txt into OUTDIR.
#   scripts/gpu_check.sh OUTDIR         on a machine with a CUDA GPU (the device tool: OUTDIR=$OUT)
#   scripts/gpu_check.sh --cpu OUTDIR   the same steps on CPU tensors, small sizes (make test)
# Uses only what the machine has: $PY (default python3) with its torch (2.11 or newer) and triton,
# ninja and compute-sanitizer where present. It installs nothing and needs no network.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if [ $# -lt 1 ]; then
  echo "usage: scripts/gpu_check.sh [--cpu] [--budget SECONDS] [--only STEP,...] OUTDIR" >&2
  exit 2
fi
exec "$PY" scripts/gpucheck/run.py "$@"
