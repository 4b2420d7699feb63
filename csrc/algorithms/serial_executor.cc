#include "serial_executor.h"

namespace cgx {

SerialExecutor::SerialExecutor() : thread_([this] { loop(); }) {}

SerialExecutor::~SerialExecutor() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

SerialExecutor::Ticket SerialExecutor::post(std::function<void()> task) {
  std::lock_guard<std::mutex> lk(mu_);
  queue_.push_back(std::move(task));
  cv_.notify_all();
  return ++posted_;
}

void SerialExecutor::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = failure_ != nullptr;
    lk.unlock();
    std::exception_ptr error;
    if (!skip) {
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
    }
    lk.lock();
    if (error && !failure_) failure_ = error;
    ++done_;
    cv_.notify_all();
  }
}

void SerialExecutor::wait(Ticket t) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_ >= t; });
  if (failure_) std::rethrow_exception(failure_);
}

void SerialExecutor::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_ >= posted_; });
  failure_ = nullptr;
}

}  // namespace cgx
