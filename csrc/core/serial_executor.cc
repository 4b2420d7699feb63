#include "serial_executor.h"

namespace cgx {

SerialExecutor::SerialExecutor() : thread_([this] { loop(); }) {}

void SerialExecutor::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SerialExecutor::Ticket SerialExecutor::post(std::function<void()> task) {
  std::lock_guard<std::mutex> lk(mu_);
  queue_.push_back(std::move(task));
  cv_.notify_all();
  return ++posted_;
}

void SerialExecutor::run_one(std::function<void()>& task, Ticket ticket) {
  bool skip;
  {
    std::lock_guard<std::mutex> lk(mu_);
    skip = failed_ < ticket;
  }
  std::exception_ptr error;
  if (!skip) {
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (error && ticket < failed_) {
    failed_ = ticket;
    failure_ = error;
  }
  ++done_;
  cv_.notify_all();
}

void SerialExecutor::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    const Ticket ticket = ++started_;
    lk.unlock();
    run_one(task, ticket);
    lk.lock();
  }
}

bool SerialExecutor::run_queued_until(const std::function<bool()>& done) {
  while (!done()) {
    std::function<void()> task;
    Ticket ticket;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!on_executor_thread() || queue_.empty()) break;
      task = std::move(queue_.front());
      queue_.pop_front();
      ticket = ++started_;
    }
    run_one(task, ticket);
  }
  return done();
}

void SerialExecutor::wait(Ticket t) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_ >= t; });
  if (failed_ <= t) std::rethrow_exception(failure_);
}

void SerialExecutor::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_ >= posted_; });
  failure_ = nullptr;
  failed_ = std::numeric_limits<Ticket>::max();
}

}  // namespace cgx
