// What the compressed algorithms need from the network: blocking exchanges of opaque bytes
// (three collective ones, and point to point), plus three exact collectives of the
// hierarchical allreduce's intra-node steps (a broadcast, and fp32 sums). Implemented over
// torch's Gloo (csrc/torch/c10d_transport.cc), in memory with ranks as threads for the C++ tests
// (csrc/tests/in_memory_transport.h), and by the fuzz harness (csrc/fuzz).
//
// Contract: every rank of the group calls the same operations in the same order; sizes agree
// pairwise (what rank a sends to b is exactly what b expects from a). An implementation throws
// on failure (a dead or stalled peer must surface as an exception within its timeout).
//
// The exact collectives have default implementations over alltoallv (transport.cc), summing in
// rank order; a transport with native ones (Gloo's) overrides them. A group of ranks is one
// Transport: the hierarchical allreduce takes one for the node and one across nodes.
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

  // `bytes` at `data` of rank `root` replace `data` on every rank.
  virtual void broadcast(uint8_t* data, size_t bytes, int root);

  // Rank `root` ends with the element-wise fp32 sum of every rank's `count` values at `data`;
  // the other ranks' `data` is left as it was.
  virtual void reduce_sum(float* data, size_t count, int root);

  // `in` holds size() chunks of `count` fp32 values; `out` (`count` values) receives the sum over
  // the ranks of chunk rank().
  virtual void reduce_scatter_sum(const float* in, float* out, size_t count);
};

}  // namespace cgx
