#include "c10d_transport.h"

#include <ATen/ops/from_blob.h>

#include <atomic>
#include <csignal>
#include <numeric>

namespace cgx::binding {
namespace {

// A uint8 tensor over caller-owned memory (no copy); the inner backend only reads / writes it
// until the blocking wait below returns.
at::Tensor bytes_view(const uint8_t* p, size_t n) {
  static uint8_t dummy = 0;
  return at::from_blob(const_cast<uint8_t*>(n ? p : &dummy), {int64_t(n)},
                       at::TensorOptions().dtype(at::kByte));
}

// A float tensor over caller-owned memory, like bytes_view.
at::Tensor floats_view(const float* p, size_t n) {
  static float dummy = 0;
  return at::from_blob(const_cast<float*>(n ? p : &dummy), {int64_t(n)},
                       at::TensorOptions().dtype(at::kFloat));
}

std::vector<int64_t> as_splits(const std::vector<size_t>& sizes) {
  return std::vector<int64_t>(sizes.begin(), sizes.end());
}

std::atomic<int64_t> g_fault_countdown{-1};
std::atomic<int> g_fault_signal{0};
std::atomic<int64_t> g_ops{0};

// Counts the operation and fires the armed fault, if this is its turn.
void maybe_fault() {
  g_ops.fetch_add(1, std::memory_order_relaxed);
  if (g_fault_countdown.load(std::memory_order_relaxed) < 0) return;
  if (g_fault_countdown.fetch_sub(1) == 0) std::raise(g_fault_signal.load());
}

}  // namespace

int64_t transport_ops() { return g_ops.load(); }

void fault_after(int64_t ops, int signal) {
  g_fault_signal = signal;
  g_fault_countdown = ops < 0 ? -1 : ops;
}

void C10dTransport::alltoallv(const uint8_t* send, const std::vector<size_t>& send_sizes,
                              uint8_t* recv, const std::vector<size_t>& recv_sizes) {
  maybe_fault();
  at::Tensor in =
      bytes_view(send, std::accumulate(send_sizes.begin(), send_sizes.end(), size_t(0)));
  at::Tensor out =
      bytes_view(recv, std::accumulate(recv_sizes.begin(), recv_sizes.end(), size_t(0)));
  std::vector<int64_t> out_splits = as_splits(recv_sizes), in_splits = as_splits(send_sizes);
  inner_->alltoall_base(out, in, out_splits, in_splits)->wait();
}

void C10dTransport::allgather(const uint8_t* send, size_t bytes, uint8_t* recv) {
  maybe_fault();
  at::Tensor in = bytes_view(send, bytes);
  at::Tensor out = bytes_view(recv, bytes * size_t(size()));
  inner_->_allgather_base(out, in)->wait();
}

void C10dTransport::sendrecv(int to, const uint8_t* send, size_t send_bytes, int from,
                             uint8_t* recv, size_t recv_bytes) {
  maybe_fault();
  std::vector<at::Tensor> out = {bytes_view(send, send_bytes)};
  std::vector<at::Tensor> in = {bytes_view(recv, recv_bytes)};
  auto s = inner_->send(out, to, 0);
  auto r = inner_->recv(in, from, 0);
  s->wait();
  r->wait();
}

void C10dTransport::send(int to, const uint8_t* data, size_t bytes) {
  maybe_fault();
  std::vector<at::Tensor> out = {bytes_view(data, bytes)};
  inner_->send(out, to, 0)->wait();
}

void C10dTransport::recv(int from, uint8_t* data, size_t bytes) {
  maybe_fault();
  std::vector<at::Tensor> in = {bytes_view(data, bytes)};
  inner_->recv(in, from, 0)->wait();
}

void C10dTransport::broadcast(uint8_t* data, size_t bytes, int root) {
  maybe_fault();
  std::vector<at::Tensor> v = {bytes_view(data, bytes)};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  inner_->broadcast(v, o)->wait();
}

void C10dTransport::reduce_sum(float* data, size_t count, int root) {
  maybe_fault();
  std::vector<at::Tensor> v = {floats_view(data, count)};
  c10d::ReduceOptions o;
  o.rootRank = root;
  o.reduceOp = c10d::ReduceOp::SUM;
  inner_->reduce(v, o)->wait();
}

void C10dTransport::reduce_scatter_sum(const float* in, float* out, size_t count) {
  maybe_fault();
  at::Tensor input = floats_view(in, count * size_t(size()));
  at::Tensor output = floats_view(out, count);
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  inner_->_reduce_scatter_base(output, input, o)->wait();
}

}  // namespace cgx::binding
