// A group's traffic and time counters (ProcessGroupCGX::stats, torch_cgx's documented stats API),
// kept by the worker and read from any thread. Torch-free: atomics and a Transport decorator.
//
// Bytes: `bytes_sent` is what this rank handed to the transport; `bytes_exact` what an exact
// reduction of the same calls would have sent: for an allreduce of n values a ring over fp32,
// 2 (W - 1) / W * 4 n bytes (an exact call's own dtype where it is not floating), for a
// reduce-scatter of an input of n values (W - 1) / W * 4 n. Exact calls count what a ring sends
// in both (an exact reduce-scatter only here, not in total_bytes_sent, which predates it).
// Allreduces forwarded to the inner Gloo group (a plan's exact sizes) are not counted.
//
// Time: `wire` is the time spent inside transport calls (timed by TimedTransport, on whichever
// thread makes them); `compute` is the rest of the compressed call's time on the worker (encode,
// decode, reduction, rotation, copies), its wall time minus the wire time of the call, at least
// 0. With the pipeline (CaSync) encoding overlaps the wire, so `compute` is the compute time the
// pipeline did not hide, and compute + wire is the calls' wall time. The exact calls' Gloo
// operations and the hierarchical path's node steps count as wire time.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "algorithms/transport.h"

namespace cgx::binding {

// Nanoseconds from `start` to now (the stats' one clock).
inline int64_t ns_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

struct StatsSnapshot {
  int64_t bytes_sent = 0;
  int64_t bytes_exact = 0;
  int64_t calls_compressed = 0;
  int64_t calls_exact = 0;
  int64_t reduce_scatter_compressed = 0;
  int64_t reduce_scatter_exact = 0;
  double compute_seconds = 0;
  double wire_seconds = 0;
};

class GroupStats {
 public:
  StatsSnapshot snapshot() const;
  void reset();

  // What an exact fp32 ring allreduce of n values sends from each of W ranks.
  static int64_t ring_allreduce_bytes(int world, int64_t bytes) {
    return 2 * (world - 1) * bytes / world;
  }

  std::atomic<int64_t> bytes_sent{0};
  std::atomic<int64_t> bytes_exact{0};
  std::atomic<int64_t> calls_compressed{0};
  std::atomic<int64_t> calls_exact{0};
  std::atomic<int64_t> reduce_scatter_compressed{0};
  std::atomic<int64_t> reduce_scatter_exact{0};
  std::atomic<int64_t> compute_ns{0};
  std::atomic<int64_t> wire_ns{0};
};

// Times one compressed call on the worker: its wall time less the wire time that accrued during
// it goes to compute_ns when the clock goes out of scope (exceptions included).
class CallClock {
 public:
  explicit CallClock(GroupStats& stats)
      : stats_(stats), start_(std::chrono::steady_clock::now()), wire0_(stats.wire_ns.load()) {}
  ~CallClock();
  CallClock(const CallClock&) = delete;
  CallClock& operator=(const CallClock&) = delete;

 private:
  GroupStats& stats_;
  std::chrono::steady_clock::time_point start_;
  int64_t wire0_;
};

// Forwards to `inner`, adding the time of each operation to `wire_ns`.
class TimedTransport : public Transport {
 public:
  TimedTransport(Transport& inner, std::atomic<int64_t>& wire_ns)
      : inner_(inner), wire_ns_(wire_ns) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void alltoallv(const uint8_t* send, const std::vector<size_t>& send_sizes, uint8_t* recv,
                 const std::vector<size_t>& recv_sizes) override;
  void allgather(const uint8_t* send, size_t bytes, uint8_t* recv) override;
  void sendrecv(int to, const uint8_t* send, size_t send_bytes, int from, uint8_t* recv,
                size_t recv_bytes) override;
  void send(int to, const uint8_t* data, size_t bytes) override;
  void recv(int from, uint8_t* data, size_t bytes) override;
  void broadcast(uint8_t* data, size_t bytes, int root) override;
  void reduce_sum(float* data, size_t count, int root) override;
  void reduce_scatter_sum(const float* in, float* out, size_t count) override;

 private:
  template <typename F>
  void timed(F&& f);

  Transport& inner_;
  std::atomic<int64_t>& wire_ns_;
};

}  // namespace cgx::binding
