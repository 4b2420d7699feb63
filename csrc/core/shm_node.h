// A node's shared-memory exchange for the hierarchical allreduce: one POSIX shared-memory
// segment per node and group, a slot of `slot_bytes` per local rank and a barrier (futex-based,
// with a deadline: a rank that never arrives makes the others throw instead of hang).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace cgx {

class ShmNode {
 public:
  // Local rank 0 creates `name` (which must not exist); the others open it, waiting for it to
  // appear until `timeout`. Throws std::runtime_error naming what failed.
  ShmNode(const std::string& name, int local_rank, int local_size, size_t slot_bytes,
          std::chrono::milliseconds timeout);
  ~ShmNode();
  ShmNode(const ShmNode&) = delete;
  ShmNode& operator=(const ShmNode&) = delete;

  uint8_t* slot(int local_rank) const { return slots_ + size_t(local_rank) * slot_bytes_; }
  size_t slot_bytes() const { return slot_bytes_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Every local rank arrives before any leaves; throws std::runtime_error after the timeout.
  void barrier();
  // Removes the name (the mapping stays valid): once every rank has opened it.
  void unlink();

 private:
  struct Control;
  std::string name_;
  int local_rank_, local_size_;
  size_t slot_bytes_, bytes_;
  std::chrono::milliseconds timeout_;
  void* base_ = nullptr;
  Control* control_ = nullptr;
  uint8_t* slots_ = nullptr;
};

}  // namespace cgx
