#include "engine_stats.h"

#include <algorithm>

namespace cgx::binding {

StatsSnapshot GroupStats::snapshot() const {
  StatsSnapshot s;
  s.bytes_sent = bytes_sent.load();
  s.bytes_exact = bytes_exact.load();
  s.calls_compressed = calls_compressed.load();
  s.calls_exact = calls_exact.load();
  s.reduce_scatter_compressed = reduce_scatter_compressed.load();
  s.reduce_scatter_exact = reduce_scatter_exact.load();
  s.compute_seconds = double(compute_ns.load()) * 1e-9;
  s.wire_seconds = double(wire_ns.load()) * 1e-9;
  return s;
}

void GroupStats::reset() {
  for (std::atomic<int64_t>* c :
       {&bytes_sent, &bytes_exact, &calls_compressed, &calls_exact, &reduce_scatter_compressed,
        &reduce_scatter_exact, &compute_ns, &wire_ns}) {
    c->store(0);
  }
}

CallClock::~CallClock() {
  const int64_t wire = stats_.wire_ns.load() - wire0_;
  stats_.compute_ns += std::max<int64_t>(0, ns_since(start_) - wire);
}

template <typename F>
void TimedTransport::timed(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  try {
    f();
  } catch (...) {
    wire_ns_ += ns_since(start);
    throw;
  }
  wire_ns_ += ns_since(start);
}

void TimedTransport::alltoallv(const uint8_t* send, const std::vector<size_t>& send_sizes,
                               uint8_t* recv, const std::vector<size_t>& recv_sizes) {
  timed([&] { inner_.alltoallv(send, send_sizes, recv, recv_sizes); });
}

void TimedTransport::allgather(const uint8_t* send, size_t bytes, uint8_t* recv) {
  timed([&] { inner_.allgather(send, bytes, recv); });
}

void TimedTransport::sendrecv(int to, const uint8_t* send, size_t send_bytes, int from,
                              uint8_t* recv, size_t recv_bytes) {
  timed([&] { inner_.sendrecv(to, send, send_bytes, from, recv, recv_bytes); });
}

void TimedTransport::send(int to, const uint8_t* data, size_t bytes) {
  timed([&] { inner_.send(to, data, bytes); });
}

void TimedTransport::recv(int from, uint8_t* data, size_t bytes) {
  timed([&] { inner_.recv(from, data, bytes); });
}

void TimedTransport::broadcast(uint8_t* data, size_t bytes, int root) {
  timed([&] { inner_.broadcast(data, bytes, root); });
}

void TimedTransport::reduce_sum(float* data, size_t count, int root) {
  timed([&] { inner_.reduce_sum(data, count, root); });
}

void TimedTransport::reduce_scatter_sum(const float* in, float* out, size_t count) {
  timed([&] { inner_.reduce_scatter_sum(in, out, count); });
}

}  // namespace cgx::binding
