// The Work returned by the cgx backend for operations it runs itself (on its worker thread):
// wait() and getFuture() behave like Gloo's; the future's value is the list of output tensors.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "core/serial_executor.h"

namespace cgx::binding {

class CGXWork : public c10d::Work {
 public:
  // `worker` runs the work; it is only used from its own thread (see wait()).
  CGXWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, SerialExecutor* worker);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Waits at most `timeout` (kNoTimeout: no limit; the operation's own transport timeout
  // applies) and raises on timeout or failure. Called from a callback on the worker, for work
  // issued after the running one, it runs the queued work in place instead of deadlocking.
  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // The worker's steps, in order: start() (false if cancelled: skip the rest), execute(fn)
  // (runs fn and completes the work), publish() (completes the future: its callbacks run).
  bool start();
  void execute(std::function<void()> fn);
  void publish();
  // Fails the work if it has not started (it will not run); returns whether it did.
  bool cancel(std::exception_ptr error);

  // Set once the work is complete; lets the watchdog track it without owning it.
  const std::shared_ptr<std::atomic<bool>>& done_flag() const { return done_flag_; }

  // When the last owner lets go: the tensors go now, on that owner's thread, not with the
  // memory on whichever thread holds the last weak reference (the watchdog).
  void release_resources() override;

 private:
  bool done() const;
  void complete(std::exception_ptr error);

  enum class State { kQueued, kStarted, kCancelled };

  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  SerialExecutor* worker_;
  std::thread::id worker_thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kQueued;
  bool done_ = false;
  std::exception_ptr error_;
  std::shared_ptr<std::atomic<bool>> done_flag_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace cgx::binding
