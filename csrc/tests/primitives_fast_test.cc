// The primitives behind the faster encoders against what they replace, bit for bit, on both
// instruction sets: per-bucket sq_sum / abs_max against prim::stats, random_k against its first
// version (a plain Floyd loop).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <unordered_set>
#include <vector>

#include "core/codec_kernels.h"
#include "core/primitives.h"

namespace cgx {
namespace {

// n values of N(0, 3^2) with a few NaN, +-Inf, -0, subnormals, and (ties) small integers.
std::vector<float> hostile(int64_t n, uint32_t seed, bool specials) {
  std::mt19937 g(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float special[] = {NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 1e-40f, -1e-42f, 3e38f};
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    v = normal(g);
    if (seed % 3 == 1) v = float(int(v));
    if (specials && g() % 61 == 0) v = special[g() % 8];
  }
  return x;
}

std::vector<uint8_t> as_dtype(const std::vector<float>& x, DType t) {
  std::vector<uint8_t> b(x.size() * elem_size(t));
  for (size_t i = 0; i < x.size(); ++i) store_from_float(b.data(), t, int64_t(i), x[i]);
  return b;
}

uint32_t bits_of(float f) { return float_bits(f); }
uint64_t bits_of(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

class PrimitivesFast : public testing::TestWithParam<bool> {  // AVX2 on / off
 protected:
  void SetUp() override {
    if (!kernels::set_isa(GetParam()) && GetParam()) GTEST_SKIP() << "no AVX2 path";
  }
  void TearDown() override { kernels::set_isa(true); }
};

TEST_P(PrimitivesFast, BucketSumsAndMaximaAreStatsBitForBit) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t bucket : {1, 7, 8, 16, 512, 1000}) {
      for (uint32_t seed = 0; seed < 6; ++seed) {
        const auto x = as_dtype(hostile(5000 + seed, seed, seed % 2 == 0), t);
        for (int64_t lo : {0, 3, 512}) {
          const int64_t hi = 5000 - int64_t(seed);
          std::vector<double> sq(size_t((hi - lo) / bucket + 1));
          std::vector<float> am(sq.size());
          prim::sq_sums(x.data(), t, lo, hi, bucket, sq.data());
          prim::abs_maxes(x.data(), t, lo, hi, bucket, am.data());
          for (int64_t b = 0; b * bucket < hi - lo; ++b) {
            const auto st =
                prim::stats(x.data(), t, lo + b * bucket, std::min(hi, lo + (b + 1) * bucket));
            ASSERT_EQ(bits_of(sq[size_t(b)]), bits_of(st.sq_sum)) << bucket << " " << b;
            ASSERT_EQ(bits_of(am[size_t(b)]), bits_of(st.abs_max)) << bucket << " " << b;
            ASSERT_EQ(std::isfinite(sq[size_t(b)]), st.finite);
            ASSERT_EQ(std::isfinite(am[size_t(b)]), st.finite);
          }
        }
      }
    }
  }
}

// random_k as first written: Floyd with a hash set, sorted.
std::vector<uint32_t> random_k_v1(int64_t n, int64_t k, RngKey key) {
  k = std::clamp<int64_t>(k, 0, n);
  std::unordered_set<uint32_t> taken;
  std::vector<uint32_t> out;
  for (int64_t j = n - k, step = 0; j < n; ++j, ++step) {
    const uint64_t r =
        (uint64_t(rng_bits(key, 2 * uint64_t(step))) << 32) | rng_bits(key, 2 * uint64_t(step) + 1);
    const uint32_t pick =
        taken.count(uint32_t(r % uint64_t(j + 1))) ? uint32_t(j) : uint32_t(r % uint64_t(j + 1));
    taken.insert(pick);
    out.push_back(pick);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST_P(PrimitivesFast, RandomKIsTheFirstVersion) {
  for (int64_t n : {1, 2, 63, 64, 65, 1000, 100000, 1 << 20}) {
    for (int64_t k : {int64_t(0), int64_t(1), n / 100, n / 2, n - 1, n}) {
      const RngKey key = rng_key(uint64_t(n), uint64_t(k));
      ASSERT_EQ(prim::random_k(n, k, key), random_k_v1(n, k, key)) << n << " " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, PrimitivesFast, testing::Values(true, false),
                         [](const auto& info) { return info.param ? "avx2" : "baseline"; });

}  // namespace
}  // namespace cgx
