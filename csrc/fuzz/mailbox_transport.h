// Honest ranks as threads of one process, for the seed-corpus generator: every message is posted
// to a shared mailbox keyed by (from, to, sequence) and taken by its receiver.
#pragma once

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "algorithms/transport.h"

namespace cgx::fuzz {

class Mailbox {
 public:
  void post(int from, int to, uint64_t seq, const uint8_t* p, size_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    box_[{from, to, seq}] = std::vector<uint8_t>(p, p + n);
    cv_.notify_all();
  }
  void take(int from, int to, uint64_t seq, uint8_t* p, size_t n) {
    std::unique_lock<std::mutex> lk(mu_);
    const auto key = std::make_tuple(from, to, seq);
    cv_.wait(lk, [&] { return box_.count(key) > 0; });
    const std::vector<uint8_t> v = std::move(box_[key]);
    box_.erase(key);
    if (v.size() != n) throw std::runtime_error("mailbox: message of an unexpected size");
    if (n > 0) std::memcpy(p, v.data(), n);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, uint64_t>, std::vector<uint8_t>> box_;
};

class MailboxTransport : public Transport {
 public:
  MailboxTransport(Mailbox& box, int rank, int size)
      : box_(box), rank_(rank), size_(size), sent_(size_t(size)), got_(size_t(size)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void alltoallv(const uint8_t* send, const std::vector<size_t>& send_sizes, uint8_t* recv,
                 const std::vector<size_t>& recv_sizes) override {
    const uint64_t seq = seq_++;
    size_t at = 0;
    for (int j = 0; j < size_; ++j) {
      box_.post(rank_, j, seq, send + at, send_sizes[size_t(j)]);
      at += send_sizes[size_t(j)];
    }
    at = 0;
    for (int j = 0; j < size_; ++j) {
      box_.take(j, rank_, seq, recv + at, recv_sizes[size_t(j)]);
      at += recv_sizes[size_t(j)];
    }
  }
  void allgather(const uint8_t* send, size_t bytes, uint8_t* recv) override {
    const uint64_t seq = seq_++;
    for (int j = 0; j < size_; ++j) box_.post(rank_, j, seq, send, bytes);
    for (int j = 0; j < size_; ++j) box_.take(j, rank_, seq, recv + size_t(j) * bytes, bytes);
  }
  void sendrecv(int to, const uint8_t* send_data, size_t send_bytes, int from, uint8_t* recv_data,
                size_t recv_bytes) override {
    send(to, send_data, send_bytes);
    recv(from, recv_data, recv_bytes);
  }
  // Point to point: keyed by a per-pair counter, above the collectives' sequence numbers.
  void send(int to, const uint8_t* data, size_t bytes) override {
    box_.post(rank_, to, kP2P | sent_[size_t(to)]++, data, bytes);
  }
  void recv(int from, uint8_t* data, size_t bytes) override {
    box_.take(from, rank_, kP2P | got_[size_t(from)]++, data, bytes);
  }

 private:
  static constexpr uint64_t kP2P = uint64_t(1) << 63;
  Mailbox& box_;
  int rank_, size_;
  uint64_t seq_ = 0;
  std::vector<uint64_t> sent_, got_;
};

}  // namespace cgx::fuzz
