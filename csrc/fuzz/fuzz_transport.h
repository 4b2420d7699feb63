// Transports of the allreduce fuzz target. FuzzWire: one rank of a group whose every received
// byte from another rank comes from the fuzz input, in the order this rank receives them (zeros
// once it runs out); what the rank sends to itself is its own. Recorder: wraps an honest
// transport and logs the bytes FuzzWire would hand out, in the same order, so that a real run
// becomes a valid seed input. A rank in two groups (the hierarchical allreduce's node and
// cross-node groups) has one FuzzWire per group over one shared WireBytes, and one Recorder per
// group writing one shared log. The exact collectives (broadcast, sums) are transport.h's
// defaults over alltoallv, so their bytes flow through the same two functions.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/transport.h"

namespace cgx::fuzz {

// The fuzz input's received bytes, handed out in order (zeros once they run out).
struct WireBytes {
  const uint8_t* at;
  size_t left;
  void take(uint8_t* dst, size_t n) {
    const size_t k = std::min(n, left);
    if (k > 0) std::memcpy(dst, at, k);
    if (n > k) std::memset(dst + k, 0, n - k);
    at += k;
    left -= k;
  }
};

class FuzzWire : public Transport {
 public:
  FuzzWire(int rank, int size, const uint8_t* wire, size_t bytes)
      : rank_(rank), size_(size), own_{wire, bytes}, wire_(&own_) {}
  FuzzWire(int rank, int size, WireBytes& shared)
      : rank_(rank), size_(size), own_{nullptr, 0}, wire_(&shared) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void alltoallv(const uint8_t* send, const std::vector<size_t>& send_sizes, uint8_t* recv,
                 const std::vector<size_t>& recv_sizes) override {
    size_t from = 0, to = 0;
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) {
        own(recv + to, recv_sizes[size_t(j)], send + from, send_sizes[size_t(j)]);
      } else {
        take(recv + to, recv_sizes[size_t(j)]);
      }
      from += send_sizes[size_t(j)];
      to += recv_sizes[size_t(j)];
    }
  }
  void allgather(const uint8_t* send, size_t bytes, uint8_t* recv) override {
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) {
        own(recv + size_t(j) * bytes, bytes, send, bytes);
      } else {
        take(recv + size_t(j) * bytes, bytes);
      }
    }
  }
  void sendrecv(int, const uint8_t*, size_t, int, uint8_t* recv, size_t recv_bytes) override {
    take(recv, recv_bytes);
  }
  void send(int, const uint8_t*, size_t) override {}
  void recv(int, uint8_t* data, size_t bytes) override { take(data, bytes); }

 private:
  static void own(uint8_t* dst, size_t n, const uint8_t* src, size_t have) {
    const size_t k = std::min(n, have);
    if (k > 0) std::memcpy(dst, src, k);
    if (n > k) std::memset(dst + k, 0, n - k);
  }
  void take(uint8_t* dst, size_t n) { wire_->take(dst, n); }

  int rank_, size_;
  WireBytes own_;
  WireBytes* wire_;
};

class Recorder : public Transport {
 public:
  explicit Recorder(Transport& inner) : t_(inner), log_(&own_) {}
  Recorder(Transport& inner, std::vector<uint8_t>& shared) : t_(inner), log_(&shared) {}
  const std::vector<uint8_t>& log() const { return *log_; }
  int rank() const override { return t_.rank(); }
  int size() const override { return t_.size(); }

  void alltoallv(const uint8_t* send, const std::vector<size_t>& send_sizes, uint8_t* recv,
                 const std::vector<size_t>& recv_sizes) override {
    t_.alltoallv(send, send_sizes, recv, recv_sizes);
    size_t at = 0;
    for (int j = 0; j < size(); ++j) {
      if (j != rank()) keep(recv + at, recv_sizes[size_t(j)]);
      at += recv_sizes[size_t(j)];
    }
  }
  void allgather(const uint8_t* send, size_t bytes, uint8_t* recv) override {
    t_.allgather(send, bytes, recv);
    for (int j = 0; j < size(); ++j) {
      if (j != rank()) keep(recv + size_t(j) * bytes, bytes);
    }
  }
  void sendrecv(int to, const uint8_t* send, size_t send_bytes, int from, uint8_t* recv,
                size_t recv_bytes) override {
    t_.sendrecv(to, send, send_bytes, from, recv, recv_bytes);
    keep(recv, recv_bytes);
  }
  void send(int to, const uint8_t* data, size_t bytes) override { t_.send(to, data, bytes); }
  void recv(int from, uint8_t* data, size_t bytes) override {
    t_.recv(from, data, bytes);
    keep(data, bytes);
  }

 private:
  void keep(const uint8_t* p, size_t n) { log_->insert(log_->end(), p, p + n); }

  Transport& t_;
  std::vector<uint8_t> own_;
  std::vector<uint8_t>* log_;
};

}  // namespace cgx::fuzz
