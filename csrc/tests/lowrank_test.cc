// The fused PowerSGD passes against their definitions computed in fp64: shapes that are not
// multiples of the block or the lanes, ranks 1..70 (over the 64 accumulators of one sweep).
#include "core/lowrank.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "test_values.h"

namespace cgx {
namespace {

using testing::normal_floats;

struct Case {
  int64_t rows, cols;
  int rank;
};

class Lowrank : public ::testing::TestWithParam<Case> {};

TEST_P(Lowrank, AddAndProjectIsTheProductOfTheSum) {
  const auto [rows, cols, rank] = GetParam();
  auto m = normal_floats(size_t(rows * cols), 1);
  const auto e = normal_floats(size_t(rows * cols), 2);
  const auto qt = normal_floats(size_t(rank) * size_t(cols), 3);
  std::vector<float> p(size_t(rows) * size_t(rank), -1.f);
  const auto m0 = m;
  lowrank::add_and_project(m.data(), e.data(), qt.data(), p.data(), rows, cols, rank);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const size_t at = size_t(i * cols + j);
      ASSERT_EQ(m[at], m0[at] + e[at]);  // the same single fp32 addition
    }
    for (int k = 0; k < rank; ++k) {
      double want = 0, scale = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double x = double(m[size_t(i * cols + j)]) * qt[size_t(k * cols + j)];
        want += x;
        scale += std::fabs(x);
      }
      // fp32 partial sums over at most 512 / 8 terms each: 64 roundings of 2^-24 at most.
      EXPECT_NEAR(p[size_t(i * rank + k)], want, 64 * 6e-8 * scale + 1e-30) << i << " " << k;
    }
  }
  std::vector<float> m2 = m0;
  lowrank::add_and_project(m2.data(), nullptr, qt.data(), p.data(), rows, cols, rank);
  EXPECT_EQ(m2, m0);  // no error: the matrix is left alone
}

TEST_P(Lowrank, DecompressWritesTheProductAndTheError) {
  const auto [rows, cols, rank] = GetParam();
  auto m = normal_floats(size_t(rows * cols), 4);
  const auto p = normal_floats(size_t(rows) * size_t(rank), 5);
  const auto qt = normal_floats(size_t(rank) * size_t(cols), 6);
  std::vector<float> err(m.size(), -1.f);
  const auto m0 = m;
  lowrank::decompress(m.data(), err.data(), p.data(), qt.data(), rows, cols, rank);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double want = 0, scale = 0;
      for (int k = 0; k < rank; ++k) {
        const double x = double(p[size_t(i * rank + k)]) * qt[size_t(k * cols + j)];
        want += x;
        scale += std::fabs(x);
      }
      const size_t at = size_t(i * cols + j);
      EXPECT_NEAR(m[at], want, rank * 6e-8 * scale + 1e-30);
      EXPECT_EQ(err[at], m0[at] - m[at]);  // the error of exactly what was written
    }
  }
}

TEST_P(Lowrank, TransposeProjectIsPTransposedTimesM) {
  const auto [rows, cols, rank] = GetParam();
  const auto m = normal_floats(size_t(rows * cols), 7);
  const auto p = normal_floats(size_t(rows) * size_t(rank), 8);
  std::vector<float> qt(size_t(rank) * size_t(cols), -1.f);
  lowrank::transpose_project(m.data(), p.data(), qt.data(), rows, cols, rank);
  for (int k = 0; k < rank; ++k) {
    for (int64_t j = 0; j < cols; ++j) {
      double want = 0, scale = 0;
      for (int64_t i = 0; i < rows; ++i) {
        const double x = double(p[size_t(i * rank + k)]) * m[size_t(i * cols + j)];
        want += x;
        scale += std::fabs(x);
      }
      // fp32 sums of at most 256 rows: 256 roundings of 2^-24 at most, then fp64.
      EXPECT_NEAR(qt[size_t(k * cols + j)], want, 256 * 6e-8 * scale + 1e-30) << k << " " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Lowrank,
                         ::testing::Values(Case{1, 1, 1}, Case{3, 7, 1}, Case{5, 513, 2},
                                           Case{17, 1030, 4}, Case{2, 9, 70}, Case{64, 64, 8},
                                           Case{300, 5, 3}));

}  // namespace
}  // namespace cgx
