// cgx::Transport carried by an inner torch backend (Gloo): the bytes of the compressed
// algorithms travel as uint8 tensors through its alltoall_base, _allgather_base, send and recv.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "algorithms/transport.h"

namespace cgx::binding {

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

 private:
  c10::intrusive_ptr<c10d::Backend> inner_;
};

}  // namespace cgx::binding
