// Runs posted tasks one at a time, in the order posted, on its own thread: the communication
// side of a pipelined algorithm. Because tasks run in post order, every rank issues its
// transport calls in the same order however the compute side is timed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace cgx {

class SerialExecutor {
 public:
  using Ticket = uint64_t;

  SerialExecutor();
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  Ticket post(std::function<void()> task);

  // Waits for task `t`; rethrows its exception, or the first failure before it (tasks posted
  // after a failure are skipped: their inputs may depend on the failed one).
  void wait(Ticket t);

  // Waits until every posted task has run or been skipped, then forgets any failure. Call
  // before the buffers the tasks use go away, also when unwinding from an error.
  void drain();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  Ticket posted_ = 0;
  Ticket done_ = 0;
  std::exception_ptr failure_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cgx
