// Ranks as threads of one process: a Transport over shared mailboxes, for the algorithm tests.
#pragma once

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "algorithms/transport.h"

namespace cgx::testing {

class Hub {
 public:
  void post(int from, int to, uint64_t seq, const uint8_t* p, size_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    box_[{from, to, seq}] = std::vector<uint8_t>(p, p + n);
    cv_.notify_all();
  }
  std::vector<uint8_t> take(int from, int to, uint64_t seq) {
    std::unique_lock<std::mutex> lk(mu_);
    auto key = std::make_tuple(from, to, seq);
    cv_.wait(lk, [&] { return box_.count(key) > 0; });
    auto v = std::move(box_[key]);
    box_.erase(key);
    return v;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, uint64_t>, std::vector<uint8_t>> box_;
};

class InMemoryTransport : public Transport {
 public:
  InMemoryTransport(Hub& hub, int rank, int size) : hub_(hub), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void alltoallv(const uint8_t* send, const std::vector<size_t>& send_sizes, uint8_t* recv,
                 const std::vector<size_t>& recv_sizes) override {
    const uint64_t seq = seq_++;
    size_t off = 0;
    for (int j = 0; j < size_; ++j) {
      hub_.post(rank_, j, seq, send + off, send_sizes[j]);
      off += send_sizes[j];
    }
    off = 0;
    for (int j = 0; j < size_; ++j) {
      auto v = hub_.take(j, rank_, seq);
      EXPECT_EQ(v.size(), recv_sizes[j]);
      if (!v.empty()) std::memcpy(recv + off, v.data(), std::min(v.size(), recv_sizes[j]));
      off += recv_sizes[j];
    }
  }

  void allgather(const uint8_t* send, size_t bytes, uint8_t* recv) override {
    const uint64_t seq = seq_++;
    for (int j = 0; j < size_; ++j) hub_.post(rank_, j, seq, send, bytes);
    for (int j = 0; j < size_; ++j) {
      auto v = hub_.take(j, rank_, seq);
      EXPECT_EQ(v.size(), bytes);
      std::memcpy(recv + size_t(j) * bytes, v.data(), std::min(v.size(), bytes));
    }
  }

  // Point to point: keyed by a per-pair counter (ranks make different numbers of such calls).
  void send(int to, const uint8_t* data, size_t bytes) override {
    hub_.post(rank_, to, kP2P | sent_[to]++, data, bytes);
  }
  void recv(int from, uint8_t* data, size_t bytes) override {
    auto v = hub_.take(from, rank_, kP2P | received_[from]++);
    EXPECT_EQ(v.size(), bytes);
    std::memcpy(data, v.data(), std::min(v.size(), bytes));
  }

  void sendrecv(int to, const uint8_t* send, size_t send_bytes, int from, uint8_t* recv,
                size_t recv_bytes) override {
    const uint64_t seq = seq_++;
    hub_.post(rank_, to, seq, send, send_bytes);
    auto v = hub_.take(from, rank_, seq);
    EXPECT_EQ(v.size(), recv_bytes);
    std::memcpy(recv, v.data(), std::min(v.size(), recv_bytes));
  }

 private:
  static constexpr uint64_t kP2P = uint64_t(1) << 63;
  std::map<int, uint64_t> sent_, received_;
  Hub& hub_;
  int rank_;
  int size_;
  uint64_t seq_ = 0;
};

}  // namespace cgx::testing
