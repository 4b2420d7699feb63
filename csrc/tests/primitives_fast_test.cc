// The primitives behind the faster encoders against what they replace, bit for bit, on both
// instruction sets: per-bucket sq_sum / abs_max against prim::stats, top_k_into against top_k,
// kth_largest against std::nth_element, sampled_threshold in pieces against its first version,
// random_k against its first version (a plain Floyd loop).
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

TEST_P(PrimitivesFast, TopKIntoIsTopK) {
  std::mt19937 g(7);
  prim::TopKScratch scratch;  // reused across sizes, as a span reuses it across chunks
  for (int rep = 0; rep < 400; ++rep) {
    const int64_t n = 1 + int64_t(g() % 9000);
    const int64_t k = rep % 3 == 0 ? int64_t(g() % (n + 2)) : 1 + int64_t(g() % (n / 20 + 1));
    for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      const auto x = as_dtype(hostile(n, uint32_t(rep), rep % 2 == 0), t);
      const std::vector<uint32_t> want = prim::top_k(x.data(), t, n, k);
      std::vector<uint32_t> got(want.size() + 1, 0xdeadbeef);
      prim::top_k_into(x.data(), t, n, k, scratch, got.data());
      ASSERT_EQ(got.back(), 0xdeadbeefu) << "wrote past min(k, n) indices";
      got.pop_back();
      ASSERT_EQ(got, want) << "n " << n << " k " << k;
    }
  }
}

TEST_P(PrimitivesFast, KthLargestIsNthElement) {
  std::mt19937 g(11);
  for (int rep = 0; rep < 200; ++rep) {
    const int64_t s = 1 + int64_t(g() % 5000);
    std::vector<float> m = hostile(s, uint32_t(rep), true);
    for (float& v : m) v = std::isnan(v) ? INFINITY : std::fabs(v);  // magnitudes
    const int64_t k = 1 + int64_t(g() % uint32_t(s));
    const float got = prim::kth_largest(m.data(), s, k);
    std::nth_element(m.begin(), m.begin() + (k - 1), m.end(), std::greater<float>());
    ASSERT_EQ(bits_of(got), bits_of(m[size_t(k - 1)]));
  }
}

// sampled_threshold as first written: every position, then the loads, then nth_element.
float sampled_threshold_v1(const void* in, DType t, int64_t n, int64_t k, int64_t sample,
                           RngKey key) {
  if (n == 0 || k <= 0) return INFINITY;
  auto mag = [](float v) { return std::isnan(v) ? INFINITY : std::fabs(v); };
  std::vector<float> m;
  if (sample >= n) {
    for (int64_t i = 0; i < n; ++i) m.push_back(mag(load_as_float(in, t, i)));
  } else {
    for (int64_t j = 0; j < std::max<int64_t>(sample, 1); ++j) {
      const uint64_t r = (uint64_t(rng_bits(key, 2 * j)) << 32) | rng_bits(key, 2 * j + 1);
      m.push_back(mag(load_as_float(in, t, int64_t(r % uint64_t(n)))));
    }
  }
  const int64_t s = int64_t(m.size());
  const int64_t ks = std::clamp<int64_t>((k * s + n - 1) / n, 1, s);
  std::nth_element(m.begin(), m.begin() + (ks - 1), m.end(), std::greater<float>());
  return m[size_t(ks - 1)];
}

TEST_P(PrimitivesFast, SampledThresholdInPiecesIsTheFirstVersion) {
  for (int64_t n : {1, 100, 1024, 5000, 100003}) {
    const auto x = as_dtype(hostile(n, uint32_t(n), true), DType::kBFloat16);
    for (int64_t sample : {int64_t(1), int64_t(1024), n / 3, n, n + 5}) {
      for (int64_t k : {int64_t(1), n / 100 + 1, n / 2 + 1}) {
        const RngKey key = rng_key(uint64_t(n), uint64_t(sample));
        const float want = sampled_threshold_v1(x.data(), DType::kBFloat16, n, k, sample, key);
        // The whole, and the sample drawn in three parts as the compressors' spans do.
        ASSERT_EQ(bits_of(prim::sampled_threshold(x.data(), DType::kBFloat16, n, k, sample, key)),
                  bits_of(want));
        const int64_t s = prim::sample_size(n, sample);
        std::vector<float> m(static_cast<size_t>(s));
        for (int64_t j0 = 0; j0 < s; j0 += s / 3 + 1) {
          prim::sample_magnitudes(x.data(), DType::kBFloat16, n, sample, key, j0,
                                  std::min(s, j0 + s / 3 + 1), m.data() + j0);
        }
        ASSERT_EQ(bits_of(prim::sample_quantile(m.data(), s, n, k)), bits_of(want));
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
