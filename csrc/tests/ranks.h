// Ranks as threads: runs fn(rank) on `world` threads and returns what each threw (null: none).
// Also a transport wrapper that corrupts what its rank receives, for the receivers' checks.
#pragma once

#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "algorithms/transport.h"

namespace cgx::testing {

inline std::vector<std::exception_ptr> run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Rethrows the first rank's exception, if any (for tests where every rank must succeed).
inline void run_ranks_ok(int world, const std::function<void(int)>& fn) {
  for (auto& e : run_ranks(world, fn)) {
    if (e) std::rethrow_exception(e);
  }
}

// Forwards to `inner`; on its `call`-th alltoallv (0-based) XORs `mask` into the received byte
// at `offset` (counted from the start of what this rank receives), as a corrupt sender would.
class CorruptingTransport : public Transport {
 public:
  CorruptingTransport(Transport& inner, int call, size_t offset, uint8_t mask)
      : t_(inner), call_(call), offset_(offset), mask_(mask) {}
  int rank() const override { return t_.rank(); }
  int size() const override { return t_.size(); }
  void alltoallv(const uint8_t* send, const std::vector<size_t>& send_sizes, uint8_t* recv,
                 const std::vector<size_t>& recv_sizes) override {
    t_.alltoallv(send, send_sizes, recv, recv_sizes);
    if (calls_++ == call_) recv[offset_] ^= mask_;
  }
  void allgather(const uint8_t* send, size_t bytes, uint8_t* recv) override {
    t_.allgather(send, bytes, recv);
  }
  void sendrecv(int to, const uint8_t* send, size_t send_bytes, int from, uint8_t* recv,
                size_t recv_bytes) override {
    t_.sendrecv(to, send, send_bytes, from, recv, recv_bytes);
  }
  void send(int to, const uint8_t* data, size_t bytes) override { t_.send(to, data, bytes); }
  void recv(int from, uint8_t* data, size_t bytes) override { t_.recv(from, data, bytes); }

 private:
  Transport& t_;
  int call_;
  size_t offset_;
  uint8_t mask_;
  int calls_ = 0;
};

}  // namespace cgx::testing
