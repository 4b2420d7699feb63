// A small persistent pool for data-parallel loops over independent tasks (codec spans).
#pragma once

#include <cstdint>
#include <functional>

namespace cgx {

// Threads used by the codec for large buffers (including the caller). Default: the number of
// hardware threads (torch_cgx sets it from CGX_CODEC_THREADS / LOCAL_WORLD_SIZE at import).
int num_threads();
void set_num_threads(int n);

// Runs fn(0) .. fn(n_tasks - 1), spread over the pool; returns when all have finished. Calls
// from several threads are serialized. fn must not throw and must not call parallel_for.
void parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn);

}  // namespace cgx
