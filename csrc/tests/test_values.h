// Seeded inputs shared by the C++ tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace cgx::testing {

// n values drawn from N(offset, scale^2) by mt19937(seed): the same on every platform run.
inline std::vector<float> normal_floats(size_t n, uint32_t seed, float scale = 1.0f,
                                        float offset = 0.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(offset, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

}  // namespace cgx::testing
