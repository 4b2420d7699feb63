// What the compressed allreduce algorithms need from the network: blocking exchanges of opaque
// bytes (three collective ones, and point to point). Implemented over torch's Gloo
// (csrc/torch/c10d_transport.cc) and, for the C++ tests, in memory with ranks as threads
// (csrc/tests/in_memory_transport.h).
//
// Contract: every rank of the group calls the same operations in the same order; sizes agree
// pairwise (what rank a sends to b is exactly what b expects from a). An implementation throws
// on failure (a dead or stalled peer must surface as an exception within its timeout).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cgx {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // `send` holds one segment per destination rank, packed in rank order (send_sizes[j] bytes for
  // rank j); `recv` receives one segment per source rank, packed the same way.
  virtual void alltoallv(const uint8_t* send, const std::vector<size_t>& send_sizes, uint8_t* recv,
                         const std::vector<size_t>& recv_sizes) = 0;

  // Every rank contributes `bytes` bytes; `recv` gets size() * bytes, in rank order.
  virtual void allgather(const uint8_t* send, size_t bytes, uint8_t* recv) = 0;

  // Sends to rank `to` while receiving from rank `from`.
  virtual void sendrecv(int to, const uint8_t* send, size_t send_bytes, int from, uint8_t* recv,
                        size_t recv_bytes) = 0;

  // Point to point (the tree): messages between two ranks arrive in the order they were sent.
  virtual void send(int to, const uint8_t* data, size_t bytes) = 0;
  virtual void recv(int from, uint8_t* data, size_t bytes) = 0;
};

}  // namespace cgx
