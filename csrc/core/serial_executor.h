// Runs posted tasks one at a time, in the order posted, on its own thread. The one executor of
// the library: the communication side of a pipelined algorithm, and the worker of a cgx process
// group. Because tasks run in post order, every rank issues its transport calls in the same order
// however the posting side is timed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

namespace cgx {

class SerialExecutor {
 public:
  using Ticket = uint64_t;

  SerialExecutor();
  ~SerialExecutor() { stop(); }
  // Runs every task still queued, then stops the thread; later calls do nothing. Not from a task.
  void stop();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  Ticket post(std::function<void()> task);

  // Waits for task `t` (for executors whose tasks never call run_queued_until, which finishes
  // tasks out of post order); rethrows the first failure among tasks 1..t (tasks posted after a
  // failure are skipped: their inputs may depend on the failed one). A failure of a later task
  // is not reported here.
  void wait(Ticket t);

  // Waits until every posted task has run or been skipped, then forgets any failure. Call
  // before the buffers the tasks use go away, also when unwinding from an error.
  void drain();

  // True when called from one of this executor's tasks.
  bool on_executor_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  std::thread::id thread_id() const { return thread_.get_id(); }

  // From a task only: runs queued tasks in place, in post order, until `done()` is true or the
  // queue is empty. Returns done(). Lets a task wait for work posted after it without deadlock.
  bool run_queued_until(const std::function<bool()>& done);

 private:
  void loop();
  // Runs `task` unless a failure came before it; records its failure. Called with mu_ unlocked.
  void run_one(std::function<void()>& task, Ticket ticket);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  Ticket posted_ = 0;
  Ticket started_ = 0;  // tickets handed to run_one, in order
  Ticket done_ = 0;     // tasks finished (run or skipped)
  std::exception_ptr failure_;
  Ticket failed_ = std::numeric_limits<Ticket>::max();  // ticket of the first failure
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cgx
