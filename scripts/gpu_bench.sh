#!/usr/bin/env bash
# The GPU session's second call (docs/gpu-check.md): the package installed as a user installs it
# (pip, no build isolation, no nvcc on PATH) and its fused kernels checked from there; then every
# device codec against the device's copy, Nsight Compute's counters of each call, the sparse
# codecs' profile and the Triton kernels' launch sweep, in that order (the most needed first).
# Each step has its own timeout, cut to what is left of BUDGET (default 500 s) so that the whole
# fits one device call (540 s); a step with under 20 s left is skipped. It writes a log per step,
# JSON figures and summary.txt into OUTDIR.
#   scripts/gpu_bench.sh OUTDIR        on a machine with a CUDA GPU (the device tool: OUTDIR=$OUT)
# Uses $PY (default python3) with its torch and triton; downloads nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v "${PY:-python3}")
if [ $# -ne 1 ]; then
  echo "usage: scripts/gpu_bench.sh OUTDIR" >&2
  exit 2
fi
out=$1
mkdir -p "$out"
site=$(mktemp -d)
status=0
budget=${BUDGET:-500}
run() {  # name, timeout (s), command...
  local name=$1 limit=$2
  shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "$name: skipped, ${left} s of the budget left" | tee -a "$out/summary.txt"
    status=1
    return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - start)) s (limit $limit s)" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || status=1
}
# PATH without the directories holding nvcc (a CUDA toolkit's bin; not /usr/bin or /bin, which
# hold the compiler too): the fused kernels must not need a toolkit
no_nvcc=$(tr ':' '\n' <<<"$PATH" | while read -r d; do
  case "$d" in /usr/bin | /bin) echo "$d" ;; *) [ -x "$d/nvcc" ] || echo "$d" ;; esac
done | paste -sd: -)
echo "PATH for the install: $no_nvcc (nvcc: $(PATH=$no_nvcc command -v nvcc || echo none))" \
  | tee -a "$out/summary.txt"
run install 200 env PATH="$no_nvcc" MAX_JOBS="$(nproc)" "$PY" -m pip install -q \
  --no-build-isolation --no-deps --no-index --target "$site" .
# from the installed copy (not this checkout): max-min 4-bit and qsgd fused, self-checked, with
# an empty Triton cache: the first call's time is the user's first-use compile (the issue's figure)
cache=$(mktemp -d)
run installed-kernels 90 env -C "$site" PATH="$no_nvcc" CGX_DEVICE_KERNELS=fused \
  TRITON_CACHE_DIR="$cache" "$PY" -c '
import time, torch, torch_cgx
from torch_cgx.device import codecs, kernels
assert torch_cgx.__file__.startswith("'"$site"'"), torch_cgx.__file__
x = torch.randn(1 << 20, device="cuda")
for name, params in (("maxmin", dict(bits=4, bucket_size=512)), ("qsgd", dict(bits=4))):
    codec = codecs.get(name, **params)
    took = []
    for _ in range(2):  # the first: compile + self-check; the second: compiled
        torch.cuda.synchronize()
        t = time.perf_counter()
        codec.decode_add_(torch.zeros_like(x), codec.encode(x))
        torch.cuda.synchronize()
        took.append(time.perf_counter() - t)
    print(f"{name}: first call {took[0]:.2f} s (compile + self-check), then {took[1] * 1e3:.2f} ms")
print(torch_cgx.__file__, kernels.decisions())
assert kernels.decisions() and set(kernels.decisions().values()) == {"fused"}'
grep -h "first call" "$out/installed-kernels.log" | tee -a "$out/summary.txt"
rm -rf "$cache"
# the benchmarks run from this checkout: its extension is the one just built (same torch)
ls torch_cgx/_C*.so >/dev/null 2>&1 || cp "$site"/torch_cgx/_C*.so torch_cgx/ 2>/dev/null ||
  run build 150 env MAX_JOBS="$(nproc)" "$PY" setup.py -q build_ext --inplace
run device 130 "$PY" -m benchmarks.device --device cuda --size 64M --json "$out/device.json"
run ncu 150 "$PY" -m benchmarks.device_ncu --size 64M --out "$out" --timeout 140
run sparse 80 "$PY" -m benchmarks.device_sparse_profile --device cuda --size 64M \
  --json "$out/sparse.json"
run sweep 150 "$PY" -m benchmarks.triton_sweep --json "$out/sweep.json"
rm -rf "$site"
exit $status
