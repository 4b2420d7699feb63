#include "worker.h"

#include <c10/util/Exception.h>

#include <string>

namespace cgx::binding {

Worker::Worker(std::chrono::milliseconds timeout)
    : timeout_(timeout), watchdog_([this] { watchdog_loop(); }) {}

Worker::~Worker() { stop(); }

void Worker::stop() {
  stopped_ = true;
  executor_.stop();
  {
    std::lock_guard<std::mutex> lk(mu_);
    watch_stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void Worker::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lk(mu_);
  timeout_ = timeout;
}

c10::intrusive_ptr<c10d::Work> Worker::enqueue(int rank, std::vector<at::Tensor> outputs,
                                               c10d::OpType type, std::function<void()> fn) {
  TORCH_CHECK(!stopped_, "cgx: the group's worker has stopped (the process is exiting)");
  auto work = c10::make_intrusive<CGXWork>(rank, type, std::move(outputs), &executor_);
  auto task = [this, work, fn = std::move(fn)]() mutable {
    if (!work->start()) return;  // cancelled by the watchdog
    work->execute(std::move(fn));
    run_callbacks(*work);
  };
  if (executor_.on_executor_thread()) {
    task();  // issued from a callback of this worker's work: now, in place (see the header)
    return work;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    prune_pending();
    pending_.push_back(Pending{c10::weak_intrusive_ptr<CGXWork>(work), work->done_flag()});
  }
  executor_.post(std::move(task));
  return work;
}

void Worker::prune_pending() {
  while (!pending_.empty() && pending_.front().done->load()) pending_.pop_front();
}

void Worker::run_callbacks(CGXWork& work) {
  const bool outermost = callback_depth_++ == 0;
  if (outermost) {
    std::lock_guard<std::mutex> lk(mu_);
    callbacks_since_ = std::chrono::steady_clock::now();
  }
  work.publish();
  if (outermost) {
    std::lock_guard<std::mutex> lk(mu_);
    callbacks_since_ = std::chrono::steady_clock::time_point::max();
  }
  --callback_depth_;
}

void Worker::watchdog_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!watch_stop_) {
    cv_.wait_for(lk, std::chrono::milliseconds(200));
    prune_pending();
    const auto since = callbacks_since_;
    if (watch_stop_ || pending_.empty() || since == std::chrono::steady_clock::time_point::max() ||
        std::chrono::steady_clock::now() - since < timeout_) {
      continue;
    }
    std::deque<Pending> victims;
    victims.swap(pending_);
    const auto ms = timeout_.count();
    lk.unlock();
    cancel(victims, ms);
    lk.lock();
  }
}

void Worker::cancel(std::deque<Pending>& victims, int64_t timeout_ms) {
  std::exception_ptr error;
  try {
    C10_THROW_ERROR(DistBackendError,
                    "cgx: a future callback has blocked the group's worker for more than the "
                    "timeout (" +
                        std::to_string(timeout_ms) +
                        " ms) while this operation waited behind it; it was cancelled. A "
                        "callback may wait for collectives it issues itself, or call "
                        "Work.wait(); Future.wait() on work issued after it never returns");
  } catch (...) {
    error = std::current_exception();
  }
  for (auto& v : victims) {
    if (auto w = v.work.lock()) w->cancel(error);
  }
  victims.clear();  // the weak references go here, without the lock
}

}  // namespace cgx::binding
