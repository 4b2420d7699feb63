// The node's shared-memory exchange: ranks as threads each mapping the segment by name.
#include "core/shm_node.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace cgx {
namespace {

std::string unique_name(const char* what) {
  return "/cgx-test-" + std::to_string(getpid()) + "-" + what;
}

TEST(ShmNode, SlotsAreSharedAndTheBarrierOrdersThem) {
  const int size = 3;
  const std::string name = unique_name("slots");
  std::vector<std::vector<int>> seen(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ShmNode node(name, r, size, 64, std::chrono::milliseconds(5000));
      for (int round = 0; round < 50; ++round) {
        const int v = round * 10 + r;
        std::memcpy(node.slot(r), &v, 4);
        node.barrier();
        for (int j = 0; j < size; ++j) {
          int got;
          std::memcpy(&got, node.slot(j), 4);
          seen[size_t(r)].push_back(got);
        }
        node.barrier();  // nobody writes the next round before everyone has read
      }
      node.barrier();
      if (r == 0) node.unlink();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    ASSERT_EQ(seen[size_t(r)].size(), size_t(50 * size));
    for (int round = 0; round < 50; ++round) {
      for (int j = 0; j < size; ++j)
        EXPECT_EQ(seen[size_t(r)][size_t(round * size + j)], round * 10 + j);
    }
  }
}

TEST(ShmNode, AMissingRankMakesTheBarrierThrow) {
  const std::string name = unique_name("missing");
  ShmNode leader(name, 0, 2, 64, std::chrono::milliseconds(300));
  EXPECT_THROW(leader.barrier(), std::runtime_error);  // rank 1 never comes
  leader.unlink();
  EXPECT_THROW(ShmNode(unique_name("absent"), 1, 2, 64, std::chrono::milliseconds(100)),
               std::runtime_error);  // nobody creates it
}

}  // namespace
}  // namespace cgx
