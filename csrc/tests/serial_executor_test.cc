// The comm side of the pipeline: order, failure propagation, skipping after a failure, drain.
#include "core/serial_executor.h"

#include <gtest/gtest.h>

#include <mutex>
#include <stdexcept>
#include <vector>

namespace cgx {
namespace {

TEST(SerialExecutor, RunsInPostOrder) {
  SerialExecutor ex;
  std::vector<int> seen;
  SerialExecutor::Ticket last = 0;
  for (int i = 0; i < 100; ++i) last = ex.post([&seen, i] { seen.push_back(i); });
  ex.wait(last);
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[size_t(i)], i);
}

TEST(SerialExecutor, FailurePropagatesAndLaterTasksAreSkipped) {
  SerialExecutor ex;
  int ran = 0;
  auto a = ex.post([&] { ++ran; });
  auto b = ex.post([] { throw std::runtime_error("peer died"); });
  auto c = ex.post([&] { ++ran; });
  EXPECT_THROW(ex.wait(c), std::runtime_error);
  EXPECT_NO_THROW(ex.wait(a));  // a later task's failure is not a's
  EXPECT_THROW(ex.wait(b), std::runtime_error);
  EXPECT_THROW(ex.wait(c), std::runtime_error);
  EXPECT_EQ(ran, 1);
  ex.drain();  // forgets the failure
  auto d = ex.post([&] { ++ran; });
  ex.wait(d);
  EXPECT_EQ(ran, 2);
}

TEST(SerialExecutor, KnowsItsThreadAndRunsQueuedTasksInPlace) {
  SerialExecutor ex;
  EXPECT_FALSE(ex.on_executor_thread());
  std::vector<int> seen;
  std::mutex gate_mu;
  std::unique_lock<std::mutex> gate(gate_mu);  // holds the first task until all are posted
  bool helped = false, inside = false;
  ex.post([&] {
    std::lock_guard<std::mutex> wait_for_posts(gate_mu);
    inside = ex.on_executor_thread();
    // Waits in place for task 3, posted after this one: runs 2 and 3 now, in order.
    helped = ex.run_queued_until([&] { return seen.size() == 2; });
    seen.push_back(1);
  });
  ex.post([&] { seen.push_back(2); });
  ex.post([&] { seen.push_back(3); });
  auto last = ex.post([&] { seen.push_back(4); });
  gate.unlock();
  ex.drain();
  (void)last;
  EXPECT_TRUE(inside);
  EXPECT_TRUE(helped);
  EXPECT_EQ(seen, (std::vector<int>{2, 3, 1, 4}));
  // Outside a task it runs nothing.
  EXPECT_FALSE(ex.run_queued_until([] { return false; }));
}

}  // namespace
}  // namespace cgx
