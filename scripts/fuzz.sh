#!/usr/bin/env bash
# Runs the decoder fuzz target (build/fuzz/cgx_fuzz_decode, `make fuzz-build`) from the
# checked-in seed corpus, in a scratch corpus so that the checked-in one stays as it is, and
# prints the executions per decoder. A finding (crash, sanitizer report) fails, its input saved
# as build/fuzz/crash-*.
#   scripts/fuzz.sh SECONDS            all decoders in one run (libFuzzer shares the time)
#   scripts/fuzz.sh --each RUNS        every decoder alone for RUNS executions (the long run)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/fuzz/cgx_fuzz_decode
opts=(-max_len=4096 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -artifact_prefix=build/fuzz/)
run() {  # extra libFuzzer options...
  local work log
  work=$(mktemp -d)
  log="$work.log"
  if ! CGX_FUZZ_STATS=1 "$bin" "${opts[@]}" "$@" "$work" csrc/fuzz/corpus 2>"$log"; then
    tail -60 "$log" >&2
    rm -rf "$work" "$log"
    exit 1
  fi
  grep -E "^cgx-fuzz|number_of_executed_units|average_exec_per_sec" "$log" || true
  rm -rf "$work" "$log"
}
if [ "${1:-}" = "--each" ]; then
  runs=${2:-10000000}
  n=$(CGX_FUZZ_STATS=1 "$bin" -runs=0 2>&1 | grep -c '^cgx-fuzz')
  for ((k = 0; k < n; k++)); do
    echo "== decoder $k, $runs runs"
    CGX_FUZZ_ONLY=$k run -runs="$runs" | grep -vE '^cgx-fuzz .* 0$'
  done
else
  run -max_total_time="${1:-60}"
fi
