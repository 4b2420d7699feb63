// The group's worker: one thread (a SerialExecutor) that runs every operation the cgx backend
// runs itself, in the order issued, and a watchdog.
//
// Callbacks of the futures of this worker's work run on the worker, in the order the work was
// issued. Work enqueued from there (PowerSGD's hooks issue and wait for allreduces inside
// callbacks) runs at once, in place: every rank issues it at the same point of the same sequence,
// and waiting for it cannot deadlock. A callback that blocks on anything else for longer than the
// timeout while work waits behind it (a Future.wait on work issued later) is answered by the
// watchdog: the waiting work fails with DistBackendError instead of hanging.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "cgx_work.h"
#include "core/serial_executor.h"

namespace cgx::binding {

class Worker {
 public:
  explicit Worker(std::chrono::milliseconds timeout);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Work of `type` completing with `outputs` once `fn` has run on the worker (fn's exception
  // fails it). Raises once the worker has stopped.
  c10::intrusive_ptr<c10d::Work> enqueue(int rank, std::vector<at::Tensor> outputs,
                                         c10d::OpType type, std::function<void()> fn);
  // How long a callback may hold the worker while work waits behind it.
  void set_timeout(std::chrono::milliseconds timeout);
  bool stopped() const { return stopped_; }
  // Runs what is queued and stops the worker and the watchdog; later work raises. Idempotent.
  // The caller releases the GIL first (queued work may need it).
  void stop();

 private:
  void run_callbacks(CGXWork& work);
  // Drops the completed works at the front of pending_; with mu_ held.
  void prune_pending();
  // Fails the queued work when a future callback has held the worker longer than the timeout.
  void watchdog_loop();

  struct Pending {
    c10::weak_intrusive_ptr<CGXWork> work;  // never the last owner: no tensors freed here
    std::shared_ptr<std::atomic<bool>> done;
  };
  // Cancels each of `victims` that has not started with the watchdog's error (mu_ not held).
  static void cancel(std::deque<Pending>& victims, int64_t timeout_ms);

  // Watchdog: posted work not yet started, and since when the worker runs future callbacks.
  std::mutex mu_;
  std::condition_variable cv_;
  std::chrono::milliseconds timeout_;
  std::deque<Pending> pending_;
  std::atomic<bool> stopped_{false};
  std::chrono::steady_clock::time_point callbacks_since_ =
      std::chrono::steady_clock::time_point::max();
  int callback_depth_ = 0;  // worker thread only
  bool watch_stop_ = false;
  std::thread watchdog_;

  SerialExecutor executor_;  // last: stops (after running what is queued) before the rest goes
};

}  // namespace cgx::binding
