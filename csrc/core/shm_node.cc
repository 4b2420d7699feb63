#include "shm_node.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace cgx {

struct ShmNode::Control {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;
  char pad[56];
};

namespace {

constexpr size_t kHeader = 64;

void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, int ms) {
  timespec ts{ms / 1000, long(ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, 0x7fffffff, nullptr, nullptr,
          0);
}

[[noreturn]] void fail(const std::string& what, const std::string& name) {
  throw std::runtime_error("cgx shared memory " + name + ": " + what + " (" + std::strerror(errno) +
                           ")");
}

}  // namespace

ShmNode::ShmNode(const std::string& name, int local_rank, int local_size, size_t slot_bytes,
                 std::chrono::milliseconds timeout)
    : name_(name),
      local_rank_(local_rank),
      local_size_(local_size),
      slot_bytes_(slot_bytes),
      bytes_(kHeader + slot_bytes * size_t(local_size)),
      timeout_(timeout) {
  static_assert(sizeof(Control) <= kHeader, "control block");
  int fd = -1;
  if (local_rank == 0) {
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) fail("cannot create", name);
    if (ftruncate(fd, off_t(bytes_)) != 0) {
      close(fd);
      shm_unlink(name.c_str());
      fail("cannot size", name);
    }
    // Reserve the pages now: on a full or small /dev/shm (containers default to 64 MiB) a write
    // into an unreserved page would kill the process with SIGBUS instead of raising here.
    if (const int rc = posix_fallocate(fd, 0, off_t(bytes_)); rc != 0) {
      close(fd);
      shm_unlink(name.c_str());
      errno = rc;
      fail("cannot reserve " + std::to_string(bytes_) +
               " bytes (is /dev/shm too small? containers: --shm-size; or "
               "CGX_INNER_COMMUNICATOR_TYPE=GLOO)",
           name);
    }
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while ((fd = shm_open(name.c_str(), O_RDWR, 0600)) < 0) {
      if (errno != ENOENT || std::chrono::steady_clock::now() > deadline) fail("cannot open", name);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    struct stat st;  // wait until the creator has sized it
    while (fstat(fd, &st) == 0 && size_t(st.st_size) < bytes_) {
      if (std::chrono::steady_clock::now() > deadline) {
        close(fd);
        fail("never reached its size", name);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    fail("cannot map", name);
  }
  control_ = static_cast<Control*>(base_);  // zero-filled by ftruncate: counters start at 0
  slots_ = static_cast<uint8_t*>(base_) + kHeader;
}

ShmNode::~ShmNode() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

void ShmNode::unlink() { shm_unlink(name_.c_str()); }

void ShmNode::barrier() {
  const uint32_t gen = control_->generation.load(std::memory_order_acquire);
  if (control_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(local_size_)) {
    control_->arrived.store(0, std::memory_order_relaxed);
    control_->generation.fetch_add(1, std::memory_order_release);
    futex_wake_all(&control_->generation);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (control_->generation.load(std::memory_order_acquire) == gen) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error(
          "cgx: a rank of this node did not reach the shared-memory barrier "
          "within the timeout (" +
          std::to_string(timeout_.count()) + " ms)");
    }
    futex_wait(&control_->generation, gen, 100);
  }
}

}  // namespace cgx
