#!/usr/bin/env bash
# ThreadSanitizer over the C++ tests whose ranks, workers and codec threads run concurrently
# (build/tsan, `make tsan`): the allreduce algorithms (flat, hierarchical with its shared-memory
# pipeline, rotated, reduce-scatter) with ranks as threads over the in-memory transport, the
# serial executor (the pipeline's comm thread), the shared-memory node segment,
# and the codec's thread pool. Any report fails (halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
# Newer kernels randomize mmap beyond what older TSan runtimes map: run without ASLR if needed.
runner=()
if ! build/tsan/cgx_tsan_tests --gtest_filter='SerialExecutor.*' >/dev/null 2>&1; then
  command -v setarch >/dev/null && runner=(setarch "$(uname -m)" -R)
fi
"${runner[@]}" build/tsan/cgx_tsan_tests
