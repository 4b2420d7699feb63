#!/usr/bin/env bash
# Runs the libFuzzer targets (build/fuzz, `make fuzz-build`; docs/reliability.md, "Fuzzing") from
# the checked-in seed corpus (csrc/fuzz/corpus/TARGET), each in a scratch corpus so that the
# checked-in one stays as it is, and prints the executions per case. A finding (crash, sanitizer
# report, timeout) fails, its input saved as build/fuzz/crash-* (or timeout-*, oom-*).
#
#   scripts/fuzz.sh SECONDS [TARGET...]     each target for SECONDS, all its cases in one run,
#                                           the targets side by side
#   scripts/fuzz.sh --each RUNS [TARGET...] every case of each target alone, RUNS executions
#                                           (FUZZ_JOBS=N: N cases at a time, default 1;
#                                           FUZZ_CASES=REGEX: the cases whose label matches)
# TARGET: decode, allreduce (default: both). The seeds are first checked to be valid inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/fuzz

each=""
if [ "${1:-}" = "--each" ]; then
  each=${2:?--each RUNS}
  shift 2
else
  seconds=${1:-60}
  shift || true
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(decode allreduce)

max_len() { [ "$1" = decode ] && echo 8192 || echo 32768; }
seeds_of() { echo "csrc/fuzz/corpus/$1"; }

# fuzz TARGET LOG SEEDS [libFuzzer options...]: one libFuzzer run; fails with the log's tail.
fuzz() {
  local target=$1 log=$2 seeds=$3 work
  shift 3
  work=$(mktemp -d)
  local opts=(-max_len="$(max_len "$target")" -rss_limit_mb=2048 -timeout=30
    -print_final_stats=1 -artifact_prefix="$out/")
  local rc=0
  CGX_FUZZ_STATS=1 "$out/cgx_fuzz_$target" "${opts[@]}" "$@" "$work" "$seeds" >"$log" 2>&1 || rc=$?
  rm -rf "$work"
  [ $rc -eq 0 ] && return 0
  if [ $rc -eq 72 ]; then  # libFuzzer's exit code when interrupted (SIGINT / SIGTERM)
    echo "cgx_fuzz_$target interrupted (log: $log)" >&2
  else
    echo "FINDING in cgx_fuzz_$target, exit $rc (log: $log):" >&2
    tail -60 "$log" >&2
  fi
  return 1
}

summary() {  # LOG: executions per case, total, speed
  grep -E "^cgx-fuzz|number_of_executed_units|average_exec_per_sec" "$1" || true
}

for target in "${targets[@]}"; do
  bin=$out/cgx_fuzz_$target
  seeds=$(seeds_of "$target")
  [ -x "$bin" ] || { echo "$bin missing: make fuzz-build" >&2; exit 1; }
  # Every seed must be accepted (a valid payload / an honest run), else the corpus is stale.
  CGX_FUZZ_STRICT=1 "$bin" -runs=0 -max_len="$(max_len "$target")" -artifact_prefix="$out/" "$seeds" \
    >"$out/seeds-$target.log" 2>&1 ||
    { tail -20 "$out/seeds-$target.log" >&2; echo "stale seed in $seeds: make fuzz-corpus" >&2; exit 1; }
  if [ -z "$each" ]; then  # timed: the targets run side by side (one core each), below
    continue
  fi
  # --each: one run per case with only that case's seeds (files named after its label).
  mapfile -t cases < <(CGX_FUZZ_LIST=1 "$bin" | grep -E -- "${FUZZ_CASES:-.}")
  run_case() {
    local k=${1%% *} label=${1#* } name dir log start
    name=${label//:/_}
    name=${name//=/}
    dir=$(mktemp -d)
    cp "$seeds/$name"-* "$dir"/ 2>/dev/null || true
    log=$out/each-$target-$k.log
    start=$(date +%s)
    CGX_FUZZ_ONLY=$k fuzz "$target" "$log" "$dir" -runs="$each" || { rm -rf "$dir"; return 1; }
    rm -rf "$dir"
    printf '%-10s %-62s %12s executions %6s s\n' "$target" "$label" \
      "$(grep -F "cgx-fuzz $label " "$log" | awk '{print $NF}')" "$(($(date +%s) - start))"
  }
  export -f run_case fuzz max_len
  export target seeds each out
  # The cases in a process group of their own: an interrupt of this script stops every case's
  # fuzzer too (killing only the script would leave xargs starting the next cases).
  printf '%s\n' "${cases[@]}" >"$out/cases-$target.txt"
  setsid xargs -a "$out/cases-$target.txt" -P "${FUZZ_JOBS:-1}" -I{} bash -c 'run_case "$@"' _ {} &
  group=$!
  trap 'kill -TERM -- -"$group" 2>/dev/null; echo "interrupted: every case stopped" >&2; exit 130' \
    INT TERM
  wait "$group"
  trap - INT TERM
done

[ -z "$each" ] || exit 0
# Timed: every target for SECONDS at the same time (one libFuzzer process each: `make test`'s
# 2 x 30 s of fuzzing in 30 s of wall time on two cores), then each one's summary in order.
start=$SECONDS
pids=()
for target in "${targets[@]}"; do
  fuzz "$target" "$out/fuzz-$target.log" "$(seeds_of "$target")" -max_total_time="$seconds" &
  pids+=($!)
done
failed=0
for i in "${!targets[@]}"; do
  wait "${pids[$i]}" || failed=1
  echo "== cgx_fuzz_${targets[$i]}, ${seconds} s"
  summary "$out/fuzz-${targets[$i]}.log"
done
echo "wall: $((SECONDS - start)) s"
exit $failed
