// The seeded block rotation against its definition (a dense H D / sqrt(B) in fp64), round trips,
// the norm it preserves, linearity across "ranks", thread-count independence and bad arguments.
#include "core/rotation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "test_values.h"

namespace cgx {
namespace {

using testing::normal_floats;

// Entry (r, c) of the Sylvester Hadamard matrix: (-1)^popcount(r & c).
double hadamard_entry(int64_t r, int64_t c) { return __builtin_popcountll(r & c) % 2 ? -1.0 : 1.0; }

// The sign the rotation gives value j of a block, read back from rotating a unit vector e_0:
// y = H D e_0 / sqrt(B) = d_0 * H[:, 0] / sqrt(B), so y[0] * sqrt(B) = d_0; e_j likewise.
double sign_of(int64_t block, uint64_t seed, int64_t k, int64_t j) {
  std::vector<float> x(size_t(block * (k + 1)), 0.f);
  x[size_t(k * block + j)] = 1.f;
  rotation::rotate(x.data(), int64_t(x.size()), block, seed, true);
  // y = d_j * H[:, j] / sqrt(B): y[0] = d_j / sqrt(B).
  return x[size_t(k * block)] * std::sqrt(double(block));
}

class Rotation : public ::testing::TestWithParam<int64_t> {};

TEST_P(Rotation, MatchesTheDenseDefinition) {
  const int64_t b = GetParam();
  const int64_t blocks = 3;
  auto x = normal_floats(size_t(b * blocks), 1);
  auto y = x;
  rotation::rotate(y.data(), int64_t(y.size()), b, 42, true);
  for (int64_t k = 0; k < blocks; ++k) {
    std::vector<double> d(static_cast<size_t>(b), 0.0);
    for (int64_t j = 0; j < b; ++j) {
      const double sign = sign_of(b, 42, k, j);  // +-1 up to the scale's rounding
      ASSERT_NEAR(std::abs(sign), 1.0, 1e-6) << "block " << k << " value " << j;
      d[size_t(j)] = sign > 0 ? 1.0 : -1.0;
    }
    for (int64_t r = 0; r < b; ++r) {
      double want = 0;
      for (int64_t c = 0; c < b; ++c)
        want += hadamard_entry(r, c) * d[size_t(c)] * x[size_t(k * b + c)];
      want /= std::sqrt(double(b));
      EXPECT_NEAR(y[size_t(k * b + r)], want, 1e-5 * std::sqrt(double(b)) * 4) << r;
    }
  }
}

TEST_P(Rotation, RoundTripAndNorm) {
  const int64_t b = GetParam();
  auto x = normal_floats(size_t(b * 5), 2);
  auto y = x;
  rotation::rotate(y.data(), int64_t(y.size()), b, 7, true);
  double nx = 0, ny = 0;
  for (size_t i = 0; i < x.size(); ++i) nx += double(x[i]) * x[i], ny += double(y[i]) * y[i];
  EXPECT_NEAR(ny, nx, 1e-5 * nx);  // orthogonal
  rotation::rotate(y.data(), int64_t(y.size()), b, 7, false);
  // Each output is a sum of B terms rounded log2(B) times: a few fp32 ulps per level.
  const double tol = 1e-6 * (std::log2(double(b)) + 1) * 4;
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], tol * (1 + std::abs(x[i]))) << i;
}

INSTANTIATE_TEST_SUITE_P(Blocks, Rotation, ::testing::Values(2, 4, 8, 32, 64, 1024));

TEST(RotationProps, SpreadsAnOutlier) {
  // One value of 1000 among small ones: after rotating, every value of its block is about
  // 1000 / sqrt(B), so the block's range shrinks from ~1000 to ~2 * 1000 / sqrt(B).
  const int64_t b = 1024;
  auto x = normal_floats(size_t(b), 3);
  for (auto& v : x) v *= 0.01f;
  x[17] = 1000.f;
  rotation::rotate(x.data(), b, b, 5, true);
  float lo = x[0], hi = x[0];
  for (float v : x) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_LT(hi - lo, 2 * 1000 / 32.0 + 1.0);
}

TEST(RotationProps, LinearAcrossRanksAndSeedsMatter) {
  const int64_t b = 256, n = b * 8;
  auto a = normal_floats(size_t(n), 4), c = normal_floats(size_t(n), 5);
  std::vector<float> sum(static_cast<size_t>(n), 0.f);
  for (int64_t i = 0; i < n; ++i) sum[size_t(i)] = a[size_t(i)] + c[size_t(i)];
  auto ra = a, rc = c, rs = sum, other = a;
  rotation::rotate(ra.data(), n, b, 9, true);
  rotation::rotate(rc.data(), n, b, 9, true);
  rotation::rotate(rs.data(), n, b, 9, true);
  rotation::rotate(other.data(), n, b, 10, true);
  int differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(ra[size_t(i)] + rc[size_t(i)], rs[size_t(i)], 1e-4);
    differ += other[size_t(i)] != ra[size_t(i)];
  }
  EXPECT_GT(differ, n / 2);  // another seed, other signs
}

TEST(RotationProps, SameBitsOnAnyThreadCount) {
  const int64_t b = 64, n = b * 4096;  // 256 Ki values: several tasks
  const auto x = normal_floats(size_t(n), 6);
  const int saved = num_threads();
  std::vector<std::vector<float>> out;
  for (int threads : {1, 2, 4}) {
    set_num_threads(threads);
    auto y = x;
    rotation::rotate(y.data(), n, b, 11, true);
    out.push_back(y);
  }
  set_num_threads(saved);
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(out[0], out[2]);
}

TEST(RotationProps, RejectsBadArguments) {
  std::vector<float> x(48);
  EXPECT_THROW(rotation::rotate(x.data(), 48, 32, 1, true), InvalidArgument);  // not a multiple
  EXPECT_THROW(rotation::rotate(x.data(), 48, 3, 1, true), InvalidArgument);   // not a power of 2
  EXPECT_THROW(rotation::rotate(x.data(), 48, 1, 1, true), InvalidArgument);
  EXPECT_THROW(rotation::rotate(x.data(), 48, int64_t(1) << 21, 1, true), InvalidArgument);
  EXPECT_NO_THROW(rotation::rotate(x.data(), 0, 16, 1, true));  // nothing to do
}

}  // namespace
}  // namespace cgx
