// The rotation wrapper (algorithms/rotated.h) around the compressed allreduce with ranks as
// threads: replicas bit-identical; the error, measured back in the caller's domain, within the
// codec's bound of the rotated values (the rotation is orthogonal: per bucket, the L2 norm of the
// error is that of the rotated error, at most sqrt(B) times its largest value); the tail that
// fills no bucket is reduced unrotated; the residuals, rotated back, sum to what was lost.
#include "algorithms/rotated.h"

#include <gtest/gtest.h>

#include <cmath>

#include "algorithms/allreduce.h"
#include "algorithms/error_bound.h"
#include "core/error.h"
#include "core/rotation.h"
#include "in_memory_transport.h"
#include "ranks.h"
#include "test_values.h"

namespace cgx {
namespace {

constexpr int64_t kBucket = 64;

struct Bucket {
  double range = 0, magnitude = 0;
};

Bucket extent(const float* v, int64_t n) {
  float mn = v[0], mx = v[0];
  for (int64_t i = 1; i < n; ++i) {
    mn = std::min(mn, v[i]);
    mx = std::max(mx, v[i]);
  }
  return {double(mx) - double(mn), std::max(std::fabs(double(mn)), std::fabs(double(mx)))};
}

void check(int world, int64_t n, bool average, bool feedback) {
  SCOPED_TRACE(::testing::Message() << "W=" << world << " n=" << n << " average=" << average);
  std::vector<std::vector<float>> x;
  for (int r = 0; r < world; ++r) {
    auto v = testing::normal_floats(size_t(n), uint32_t(11 + r));
    for (int64_t i = 5; i < n; i += 97) v[size_t(i)] = 50.0f;  // outliers the rotation spreads
    x.push_back(v);
  }
  auto out = x;
  std::vector<std::vector<float>> residual(static_cast<size_t>(world),
                                           std::vector<float>(static_cast<size_t>(n)));
  const uint64_t seed = rotation_seed(3, 0);
  testing::Hub hub;
  testing::run_ranks_ok(world, [&](int r) {
    testing::InMemoryTransport t(hub, r, world);
    CompressedAllreduce algo;
    AllreduceOptions o;
    o.codec.bits = 4;
    o.codec.bucket_size = kBucket;
    o.average = average;
    with_rotation(out[size_t(r)].data(), n, kBucket, seed,
                  feedback ? residual[size_t(r)].data() : nullptr,
                  [&](float* data, int64_t len, float* res) {
                    o.residual = res;
                    algo.run(t, data, DType::kFloat32, len, o);
                  });
  });
  for (int r = 1; r < world; ++r) ASSERT_EQ(out[size_t(r)], out[0]) << "rank " << r;
  // The rotated inputs, for the bound.
  auto rotated = x;
  const int64_t full = n / kBucket * kBucket;
  for (auto& v : rotated) rotation::rotate(v.data(), full, kBucket, seed, true);
  BoundParams bp;
  bp.world = world;
  bp.average = average;
  for (int64_t b0 = 0; b0 < n; b0 += kBucket) {
    const int64_t len = std::min(kBucket, n - b0);
    double range_sum = 0, magnitude_sum = 0;
    for (int r = 0; r < world; ++r) {
      const Bucket b = extent(rotated[size_t(r)].data() + b0, len);
      range_sum += b.range;
      magnitude_sum += b.magnitude;
    }
    const double bound = bucket_error_bound(range_sum, magnitude_sum, bp);
    double err2 = 0, max_err = 0;
    for (int64_t i = b0; i < b0 + len; ++i) {
      double exact = 0;
      for (int r = 0; r < world; ++r) exact += x[size_t(r)][size_t(i)];
      if (average) exact /= world;
      const double e = out[0][size_t(i)] - exact;
      err2 += e * e;
      max_err = std::max(max_err, std::fabs(e));
    }
    if (len == kBucket) {  // rotated: the L2 norm (plus fp32 rotation roundings)
      ASSERT_LE(std::sqrt(err2), std::sqrt(double(len)) * bound * (1 + 1e-4)) << "bucket " << b0;
    } else {  // the tail: unrotated, the flat bound per value
      ASSERT_LE(max_err, bound) << "tail";
    }
  }
  if (!feedback) return;
  for (int64_t i = 0; i < n; ++i) {
    double exact = 0, fed = 0;
    for (int r = 0; r < world; ++r) {
      exact += x[size_t(r)][size_t(i)];
      fed += residual[size_t(r)][size_t(i)];
    }
    const double lost = exact - double(out[0][size_t(i)]) * (average ? world : 1);
    ASSERT_NEAR(fed, lost, 1e-4 * world) << "value " << i;
  }
}

TEST(Rotated, WithinTheBoundOfTheRotatedValuesAndBitIdentical) {
  check(2, 1024, false, false);
  check(3, 1000, true, false);  // a tail of 40 values stays unrotated
  check(4, 64, false, false);
}

TEST(Rotated, ResidualsRotatedBackSumToWhatWasLost) {
  check(2, 1000, false, true);
  check(3, 1024, true, true);
}

TEST(Rotated, ForwardThenBackIsTheIdentityAndLeavesTheTail) {
  auto v = testing::normal_floats(200, 9);
  auto w = v;
  std::vector<float> res(200, 0.0f);
  bool called = false;
  with_rotation(w.data(), 200, kBucket, rotation_seed(1, 2), res.data(),
                [&](float* data, int64_t n, float*) {
                  called = true;
                  EXPECT_EQ(n, 200);
                  EXPECT_NE(data[0], v[0]);      // rotated
                  EXPECT_EQ(data[199], v[199]);  // the tail is not
                });
  EXPECT_TRUE(called);
  for (size_t i = 0; i < 200; ++i) EXPECT_NEAR(w[i], v[i], 1e-5f * (1 + std::fabs(v[i])));
  for (size_t i = 192; i < 200; ++i) EXPECT_EQ(w[i], v[i]);
}

TEST(Rotated, SeedsDifferPerCallAndGroupAndBadBlocksAreRefused) {
  EXPECT_EQ(rotation_seed(5, 7), rotation_seed(5, 7));
  EXPECT_NE(rotation_seed(5, 7), rotation_seed(5, 8));
  EXPECT_NE(rotation_seed(5, 7), rotation_seed(6, 7));
  float v[6] = {};
  const Reduction nothing = [](float*, int64_t, float*) {};
  EXPECT_THROW(with_rotation(v, 6, 3, 1, nullptr, nothing), InvalidArgument);
  EXPECT_THROW(with_rotation(v, 6, 1, 1, nullptr, nothing), InvalidArgument);
}

}  // namespace
}  // namespace cgx
