// The AVX2 primitives against their scalar definitions (primitives_lanes.h, dtype.h): the same
// bits on inputs with NaN, +-Inf, -0, subnormals, values at fp16 / bf16 rounding ties, and
// lengths that leave every tail size. Skipped where the build has no AVX2 path.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "core/codec_kernels.h"
#include "core/primitives.h"

namespace cgx {
namespace {

std::vector<float> hostile(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  const float special[] = {
      NAN,      INFINITY, -INFINITY,     -0.0f,          0.0f,         1e-40f, -1e-42f,
      65520.0f, 65519.0f, 1.0009765625f, 1.00048828125f, -2.00390625f, 3e38f};
  for (int64_t i = 0; i < n; ++i) {
    x[size_t(i)] = g() % 13 == 0 ? special[g() % 13] : normal(g);
  }
  return x;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

class PrimitivesIsa : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::set_isa(true)) GTEST_SKIP() << "no AVX2 path in this build / CPU";
  }
  void TearDown() override { kernels::set_isa(true); }
  // f() under the scalar path and under AVX2.
  template <typename F>
  auto both(F&& f) {
    kernels::set_isa(false);
    auto scalar = f();
    kernels::set_isa(true);
    return std::make_pair(scalar, f());
  }
};

TEST_F(PrimitivesIsa, StatsAreBitIdentical) {
  for (int64_t n : {1, 7, 8, 9, 15, 64, 1003}) {
    for (uint32_t seed = 0; seed < 20; ++seed) {
      std::vector<float> x = hostile(n, seed);
      if (seed % 2) {  // finite ranges too, so that the sums are numbers
        for (float& v : x) v = std::isfinite(v) ? v : 1.5f;
      }
      for (int64_t lo : {int64_t(0), std::min<int64_t>(3, n - 1)}) {
        auto [s, v] = both([&] { return prim::stats(x.data(), DType::kFloat32, lo, n); });
        EXPECT_EQ(bits(s.min), bits(v.min)) << n << " " << seed;
        EXPECT_EQ(bits(s.max), bits(v.max)) << n << " " << seed;
        EXPECT_EQ(s.finite, v.finite);
        EXPECT_EQ(s.negatives, v.negatives);
        EXPECT_EQ(std::memcmp(&s.sum, &v.sum, 8), 0) << s.sum << " " << v.sum;
        EXPECT_EQ(std::memcmp(&s.abs_sum, &v.abs_sum, 8), 0) << s.abs_sum << " " << v.abs_sum;
        EXPECT_EQ(std::memcmp(&s.sq_sum, &v.sq_sum, 8), 0) << s.sq_sum << " " << v.sq_sum;
      }
    }
  }
}

TEST_F(PrimitivesIsa, LevelCodesAreBitIdentical) {
  const int64_t n = 1003;
  const std::vector<float> x = hostile(n, 7);
  for (int levels : {1, 3, 127}) {
    for (bool stochastic : {false, true}) {
      prim::Levels q;
      q.levels = levels;
      q.num = float(levels);
      q.den = 2.5f;
      q.clip = levels == 3 ? 4.0f : INFINITY;
      q.neg_add = levels == 127 ? 128 : 1;
      q.stochastic = stochastic;
      q.key = rng_key(11, 5);
      for (int64_t lo : {0, 5}) {
        auto [s, v] = both([&] {
          std::vector<uint8_t> c(static_cast<size_t>(n - lo));
          const bool finite = prim::level_codes(x.data(), DType::kFloat32, lo, n, q, c.data());
          return std::make_pair(finite, c);
        });
        EXPECT_EQ(s, v) << levels << " " << stochastic << " " << lo;
        EXPECT_FALSE(s.first);  // the input holds NaN and Inf
      }
    }
  }
  // Near the generator's 2^32 counter boundary, the vector path hands over to the scalar one.
  prim::Levels q;
  q.levels = 7, q.stochastic = true, q.key = rng_key(1, 2);
  const int64_t base = (int64_t(1) << 32) - 20;
  std::vector<float> big(size_t(40), 0.3f);
  const float* shifted = big.data() - base;  // element i of the range is big[i - base]
  auto [s, v] = both([&] {
    std::vector<uint8_t> c(40);
    prim::level_codes(shifted, DType::kFloat32, base, base + 40, q, c.data());
    return c;
  });
  EXPECT_EQ(s, v);
}

TEST_F(PrimitivesIsa, ConversionsAreBitIdentical) {
  const int64_t n = 1003;
  const std::vector<float> x = hostile(n, 3);
  for (DType wire : {DType::kFloat16, DType::kBFloat16}) {
    auto [s, v] = both([&] {
      std::vector<uint16_t> h(static_cast<size_t>(n));
      prim::convert(x.data(), DType::kFloat32, h.data(), wire, n, false);
      return h;
    });
    ASSERT_EQ(s, v) << dtype_name(wire);
    std::vector<uint16_t> all(65536);  // every 16-bit pattern back to fp32, and added
    for (size_t i = 0; i < all.size(); ++i) all[i] = uint16_t(i);
    for (bool add : {false, true}) {
      auto [a, b] = both([&] {
        std::vector<float> out(all.size(), 0.5f);
        prim::convert(all.data(), wire, out.data(), DType::kFloat32, int64_t(all.size()), add);
        std::vector<uint32_t> u(out.size());
        std::memcpy(u.data(), out.data(), 4 * out.size());
        return u;
      });
      EXPECT_EQ(a, b) << dtype_name(wire) << " add " << add;
    }
  }
}

TEST_F(PrimitivesIsa, TableDecodeIsBitIdentical) {
  std::mt19937 g(9);
  for (int bits = 1; bits <= 8; ++bits) {
    const int64_t n = 1003;
    std::vector<uint8_t> packed(prim::packed_bytes(n, bits));
    for (auto& b : packed) b = uint8_t(g());
    std::vector<float> table(size_t(1) << bits);
    for (size_t c = 0; c < table.size(); ++c) table[c] = float(c) * 0.37f - 3.0f;
    for (int64_t lo : {0, 3, 8, 1000}) {
      for (bool add : {false, true}) {
        auto [s, v] = both([&] {
          std::vector<float> out(static_cast<size_t>(n), 0.25f);
          prim::decode_table(packed.data(), packed.size(), bits, lo, n, table.data(), out.data(),
                             DType::kFloat32, add);
          return out;
        });
        ASSERT_EQ(s, v) << bits << " " << lo << " " << add;
        prim::BitReader r(packed.data(), bits, lo);  // and equal to the definition
        for (int64_t i = lo; i < n; ++i) {
          const float want = table[r.get()] + (add ? 0.25f : 0.0f);
          ASSERT_EQ(s[size_t(i)], want) << bits << " " << i;
        }
      }
    }
  }
}

TEST(Primitives, FindCode3) {
  std::vector<uint8_t> packed(26, 0x66);  // codes 2, 1, 2, 1, ...
  EXPECT_EQ(prim::find_code3(packed.data(), 103), -1);
  packed[25] = 0x36;  // code 3 at element 102 (byte 25, codes 100..103)
  EXPECT_EQ(prim::find_code3(packed.data(), 103), 102);
  EXPECT_EQ(prim::find_code3(packed.data(), 102), -1);  // beyond n: not looked at
  packed[3] = 0x6c;                                     // element 13
  EXPECT_EQ(prim::find_code3(packed.data(), 103), 13);
}

// top_k's candidate path (n >= 65536) against a plain sort by (NaN first, |x| descending, index
// ascending), on normal values, heavy ties at the k-th magnitude and NaN / Inf, fp32 and bf16.
TEST(Primitives, TopKMatchesAFullSort) {
  std::mt19937 g(21);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int64_t n = 100003;
  for (int kind = 0; kind < 3; ++kind) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = kind == 1 ? float(int(g() % 5) - 2) : d(g);  // kind 1: ties
    if (kind == 2) {
      for (int j = 0; j < 50; ++j) x[g() % size_t(n)] = j % 2 ? NAN : -INFINITY;
    }
    std::vector<uint16_t> half(x.size());
    for (size_t i = 0; i < x.size(); ++i) half[i] = float_to_bf16(x[i]);
    for (DType t : {DType::kFloat32, DType::kBFloat16}) {
      const void* in = t == DType::kFloat32 ? static_cast<const void*>(x.data()) : half.data();
      std::vector<uint32_t> order(static_cast<size_t>(n));
      for (size_t i = 0; i < order.size(); ++i) order[i] = uint32_t(i);
      auto mag = [&](uint32_t i) { return std::fabs(load_as_float(in, t, i)); };
      std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        const bool na = std::isnan(mag(a)), nb = std::isnan(mag(b));
        if (na != nb) return na;
        return !na && mag(a) > mag(b);
      });
      for (int64_t k : {1, 7, 1000, 20000}) {
        std::vector<uint32_t> want(order.begin(), order.begin() + k);
        std::sort(want.begin(), want.end());
        for (bool avx2 : {false, true}) {
          kernels::set_isa(avx2);
          EXPECT_EQ(prim::top_k(in, t, n, k), want) << kind << " " << dtype_name(t) << " " << k;
        }
        kernels::set_isa(true);
      }
    }
  }
}

// random_k's bitmap and hash-set paths against Floyd's algorithm written out with std::set.
TEST(Primitives, RandomKIsFloydsSample) {
  for (auto [n, k] :
       {std::pair<int64_t, int64_t>{100000, 1000}, {100000, 99999}, {int64_t(1) << 26, 50}}) {
    const RngKey key = rng_key(5, uint64_t(n));
    std::set<uint32_t> want;
    for (int64_t j = n - k, step = 0; j < n; ++j, ++step) {
      const uint64_t r64 = (uint64_t(rng_bits(key, 2 * uint64_t(step))) << 32) |
                           rng_bits(key, 2 * uint64_t(step) + 1);
      const uint32_t r = uint32_t(r64 % uint64_t(j + 1));
      want.insert(want.count(r) ? uint32_t(j) : r);
    }
    const auto got = prim::random_k(n, k, key);
    EXPECT_EQ(got, std::vector<uint32_t>(want.begin(), want.end())) << n << " " << k;
  }
}

TEST(Primitives, BitWriterPutCodesMatchesPut) {
  std::mt19937 g(4);
  for (int bits = 1; bits <= 8; ++bits) {
    for (int64_t lead : {0, 1, 3, 8}) {
      std::vector<uint8_t> codes(size_t(lead + 77));
      for (auto& c : codes) c = uint8_t(g() & ((1u << bits) - 1));
      std::vector<uint8_t> a(prim::packed_bytes(int64_t(codes.size()), bits) + 8, 0xee);
      std::vector<uint8_t> b = a;
      prim::BitWriter one(a.data(), bits), many(b.data(), bits);
      for (uint8_t c : codes) one.put(c);
      for (int64_t i = 0; i < lead; ++i) many.put(codes[size_t(i)]);
      many.put_codes(codes.data() + lead, int64_t(codes.size()) - lead);
      one.finish();
      many.finish();
      EXPECT_EQ(a, b) << bits << " " << lead;
    }
  }
}

}  // namespace
}  // namespace cgx
