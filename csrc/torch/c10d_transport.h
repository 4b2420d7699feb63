// cgx::Transport carried by an inner torch backend (Gloo): the bytes of the compressed
// algorithms travel as uint8 tensors through its alltoall_base, _allgather_base, send, recv and
// broadcast; the exact fp32 sums (the hierarchical allreduce's node sums) are its own reduce
// and _reduce_scatter_base on float tensors.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "algorithms/transport.h"

namespace cgx::binding {

// Test hook (torch_cgx._C._fault_after; tests/test_faults.py): the transport operation that
// begins `ops` operations from now (0: the next one), in any cgx group of this process, first
// raises `signal` on this process, e.g. SIGKILL or SIGSTOP in a chosen step of an algorithm.
// ops < 0 disarms it.
void fault_after(int64_t ops, int signal);
// Transport operations begun in this process so far (the test hook's unit).
int64_t transport_ops();

class C10dTransport : public Transport {
 public:
  explicit C10dTransport(c10::intrusive_ptr<c10d::Backend> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->getRank(); }
  int size() const override { return inner_->getSize(); }
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
  c10::intrusive_ptr<c10d::Backend> inner_;
};

}  // namespace cgx::binding
