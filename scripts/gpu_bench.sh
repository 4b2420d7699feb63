#!/usr/bin/env bash
# The GPU session's second call (docs/gpu.md, "First GPU runs"): the Triton kernels' launch sweep,
# every device codec against the device's copy, and the sparse codecs' profile, each with its own
# timeout so that the whole fits one device call (540 s; the build first, about a minute on 16
# cores where the machine was not warm), writing JSON and logs into OUTDIR.
#   scripts/gpu_bench.sh OUTDIR        on a machine with a CUDA GPU (the device tool: OUTDIR=$OUT)
# Uses $PY (default python3) with its torch and triton; installs nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if [ $# -ne 1 ]; then
  echo "usage: scripts/gpu_bench.sh OUTDIR" >&2
  exit 2
fi
out=$1
mkdir -p "$out"
status=0
run() {  # name, timeout (s), command...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s (limit $limit s)" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || status=1
}
# the native codecs the benchmarks compare with (a no-op where the extension is built already)
run build 150 env MAX_JOBS="$(nproc)" "$PY" setup.py -q build_ext --inplace
run sweep 180 "$PY" -m benchmarks.triton_sweep --json "$out/sweep.json"
run device 120 "$PY" -m benchmarks.device --device cuda --size 64M --json "$out/device.json"
run sparse 80 "$PY" -m benchmarks.device_sparse_profile --device cuda --size 64M \
  --json "$out/sparse.json"
exit $status
