#include "cgx_work.h"

#include <c10/util/Exception.h>

namespace cgx::binding {

CGXWork::CGXWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                 SerialExecutor* worker)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
      worker_(worker),
      worker_thread_(worker->thread_id()) {}

bool CGXWork::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

bool CGXWork::isCompleted() { return done(); }

bool CGXWork::isSuccess() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_ && !error_;
}

std::exception_ptr CGXWork::exception() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

std::vector<at::Tensor> CGXWork::result() { return outputs_; }

bool CGXWork::wait(std::chrono::milliseconds timeout) {
  // On the worker (a future callback), work queued behind the running one can only finish if
  // it runs here. Only dereferenced on the worker's own thread, where it is alive.
  if (std::this_thread::get_id() == worker_thread_ && !done()) {
    worker_->run_queued_until([this] { return done(); });
    if (!done()) {
      C10_THROW_ERROR(DistBackendError,
                      "cgx: a callback on the group's worker waits for work that cannot run "
                      "before the callback returns");
    }
  }
  std::unique_lock<std::mutex> lk(mu_);
  if (timeout == ::kNoTimeout) {
    cv_.wait(lk, [&] { return done_; });
  } else if (!cv_.wait_for(lk, timeout, [&] { return done_; })) {
    C10_THROW_ERROR(DistBackendError, "cgx: operation timed out after " +
                                          std::to_string(timeout.count()) +
                                          " ms (Work.wait timeout); it goes on in the background");
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> CGXWork::getFuture() { return future_; }

bool CGXWork::start() {
  std::lock_guard<std::mutex> lk(mu_);
  if (state_ != State::kQueued) return false;
  state_ = State::kStarted;
  return true;
}

void CGXWork::complete(std::exception_ptr error) {
  {
    // Done before the future: a callback may wait() on this very work.
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
    error_ = error;
  }
  done_flag_->store(true);
  cv_.notify_all();
}

void CGXWork::release_resources() {
  outputs_.clear();
  future_.reset();
}

void CGXWork::execute(std::function<void()> fn) {
  std::exception_ptr error;
  try {
    fn();
  } catch (...) {
    error = std::current_exception();
  }
  fn = nullptr;  // releases the task's tensors now, while waiters do not hold the GIL
  complete(error);
}

void CGXWork::publish() {
  std::exception_ptr error = exception();
  try {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  } catch (const std::exception& e) {
    // A callback attached with addCallback threw: nothing can receive it any more.
    TORCH_WARN("cgx: a future callback raised: ", e.what());
  }
}

bool CGXWork::cancel(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ != State::kQueued) return false;
    state_ = State::kCancelled;
  }
  complete(error);
  publish();
  return true;
}

}  // namespace cgx::binding
