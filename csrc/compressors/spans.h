// Data-parallel encoding on the codec's thread pool (core/thread_pool.h), as max-min's codec does:
// [0, n) is cut into consecutive spans whose starts are multiples of an alignment (whole buckets,
// whole bytes of a bit stream), and each span is encoded on its own. Every span writes bytes that
// depend on its own range only, so the payload is the same on every thread count. Small inputs
// run inline on the caller's thread, without the pool (whose calls are serialized).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace cgx::spans {

constexpr int64_t kMinSpan = int64_t(1) << 17;  // elements per task, at least (512 KiB of fp32)
constexpr int64_t kMaxSpan = int64_t(1) << 20;  // at most: more tasks than threads, to balance

// The smallest multiple of both a and b (a, b >= 1).
inline int64_t lcm(int64_t a, int64_t b) { return a / std::gcd(a, b) * b; }

// Element i of an array of dtype t.
inline const void* at(const void* p, DType t, int64_t i) {
  return static_cast<const uint8_t*>(p) + size_t(i) * elem_size(t);
}

// Asks for the cache lines of elements [begin, end) of p (a hint: the caller reads them soon).
inline void prefetch(const void* p, DType t, int64_t begin, int64_t end) {
  const auto* b = static_cast<const char*>(at(p, t, begin));
  const auto* e = static_cast<const char*>(at(p, t, end));
  for (; b < e; b += 64) __builtin_prefetch(b);
}

// The span length for n elements: a multiple of `align` near n / threads, within the bounds.
inline int64_t span_for(int64_t n, int64_t align) {
  const int64_t threads = num_threads();
  if (threads <= 1 || n <= kMinSpan) return std::max<int64_t>(n, 1);
  const int64_t target = std::clamp<int64_t>((n + threads - 1) / threads, kMinSpan, kMaxSpan);
  return std::max<int64_t>(1, target / align) * align;
}

// task(t) for t in [0, tasks): on the pool when there are several, else on this thread. The first
// exception a task throws is rethrown here once all have run (none escapes into the pool).
template <typename T>
void run_tasks(int64_t tasks, T&& task) {
  if (tasks <= 1) {
    if (tasks == 1) task(int64_t(0));
    return;
  }
  std::mutex mu;
  std::exception_ptr error;
  parallel_for(tasks, [&](int64_t t) {
    try {
      task(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

// fn(begin, end) for consecutive spans covering [0, n), each begin a multiple of `align`.
template <typename F>
void for_each_span(int64_t n, int64_t align, F&& fn) {
  if (n <= 0) return;
  const int64_t span = span_for(n, align);
  run_tasks((n + span - 1) / span, [&](int64_t t) { fn(t * span, std::min(n, (t + 1) * span)); });
}

// for_each_span that keeps what fn(begin, end) returns for each span, in order.
template <typename R, typename F>
std::vector<R> map_spans(int64_t n, int64_t align, F&& fn) {
  const int64_t span = span_for(n, align);
  std::vector<R> out(size_t(n > 0 ? (n + span - 1) / span : 0));
  run_tasks(int64_t(out.size()),
            [&](int64_t t) { out[size_t(t)] = fn(t * span, std::min(n, (t + 1) * span)); });
  return out;
}

// first() on one task while fn(begin, end) runs over the spans of [0, n) on the others (first()
// is task 0, which the pool hands out first); in that order on one thread for small inputs.
template <typename A, typename F>
void beside(A&& first, int64_t n, int64_t align, F&& fn) {
  const int64_t span = span_for(n, align);
  const int64_t spans = n > 0 ? (n + span - 1) / span : 0;
  if (spans <= 1) {
    first();
    if (n > 0) fn(int64_t(0), n);
    return;
  }
  run_tasks(spans + 1, [&](int64_t t) {
    if (t == 0) return first();
    fn((t - 1) * span, std::min(n, t * span));
  });
}

}  // namespace cgx::spans
