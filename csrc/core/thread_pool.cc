#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "error.h"

namespace cgx {
namespace {

// The Python front sets the count from CGX_CODEC_THREADS / LOCAL_WORLD_SIZE at import
// (torch_cgx/config.py); the core itself reads no environment.
int default_threads() {
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : int(hw);
}

class Pool {
 public:
  Pool() : size_(default_threads()) {}
  ~Pool() { stop_workers(); }

  int size() const { return size_; }

  void resize(int n) {
    CGX_CHECK_ARG(n >= 1 && n <= 1024, "number of codec threads must be in [1, 1024], got ", n);
    std::lock_guard<std::mutex> call(call_mu_);
    stop_workers();
    size_ = n;
  }

  void run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
    if (n_tasks <= 0) return;
    std::lock_guard<std::mutex> call(call_mu_);
    int helpers = int(std::min<int64_t>(size_ - 1, n_tasks - 1));
    if (helpers <= 0) {
      for (int64_t i = 0; i < n_tasks; ++i) fn(i);
      return;
    }
    start_workers();
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      n_tasks_ = n_tasks;
      next_.store(0);
      active_ = helpers;
      wanted_ = helpers;
      ++generation_;
    }
    cv_.notify_all();
    drain();
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return active_ == 0; });
    fn_ = nullptr;
  }

 private:
  void drain() {
    for (int64_t i = next_.fetch_add(1); i < n_tasks_; i = next_.fetch_add(1)) (*fn_)(i);
  }

  void start_workers() {
    while (int(workers_.size()) < size_ - 1) {
      workers_.emplace_back([this] { worker(); });
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
    stopping_ = false;
  }

  void worker() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stopping_ || (generation_ != seen && wanted_ > 0); });
      if (stopping_) return;
      seen = generation_;
      --wanted_;
      lk.unlock();
      drain();
      lk.lock();
      if (--active_ == 0) done_cv_.notify_one();
    }
  }

  std::mutex call_mu_;  // one parallel loop at a time
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  int active_ = 0;
  int wanted_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  int size_;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

int num_threads() { return pool().size(); }
void set_num_threads(int n) { pool().resize(n); }
void parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  pool().run(n_tasks, fn);
}

}  // namespace cgx
