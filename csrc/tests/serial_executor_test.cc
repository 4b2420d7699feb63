// The comm side of the pipeline: order, failure propagation, skipping after a failure, drain.
#include "algorithms/serial_executor.h"

#include <gtest/gtest.h>

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
  try {
    ex.wait(a);  // may already report b's failure, which is fine
  } catch (const std::runtime_error&) {
  }
  EXPECT_THROW(ex.wait(b), std::runtime_error);
  EXPECT_THROW(ex.wait(c), std::runtime_error);
  EXPECT_EQ(ran, 1);
  ex.drain();  // forgets the failure
  auto d = ex.post([&] { ++ran; });
  ex.wait(d);
  EXPECT_EQ(ran, 2);
}

}  // namespace
}  // namespace cgx
