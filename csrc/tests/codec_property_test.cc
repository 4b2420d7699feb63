// Properties of the codec over bits 1..8, many sizes and bucket sizes, all dtypes: exact wire
// size, the nearest-rounding error bound of docs/FORMAT.md, decode_add = out + decode, and the
// same bytes whatever the thread count or instruction set.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <vector>

#include "core/codec.h"
#include "core/codec_kernels.h"
#include "core/thread_pool.h"
#include "test_values.h"

namespace cgx {
namespace {

std::vector<uint8_t> encode_vec(const std::vector<float>& x, const CodecParams& p) {
  std::vector<uint8_t> out(encoded_size(int64_t(x.size()), DType::kFloat32, p));
  encode(x.data(), DType::kFloat32, int64_t(x.size()), p, out.data(), out.size());
  return out;
}

using testing::normal_floats;

// docs/FORMAT.md, "Error bound": unit * (1/2 + 4 L 2^-24) + 2^-23 max(|mn|, |mx|) + 2^-149 (L+1).
void expect_within_bound(const std::vector<float>& x, const std::vector<float>& y, int bits,
                         int64_t bucket, int64_t quantized) {
  const double levels = (1 << bits) - 1;
  for (int64_t s = 0; s < int64_t(x.size()); s += bucket) {
    const int64_t e = std::min<int64_t>(s + bucket, int64_t(x.size()));
    double mn = x[s], mx = x[s];
    for (int64_t i = s; i < e; ++i) {
      mn = std::min<double>(mn, x[i]);
      mx = std::max<double>(mx, x[i]);
    }
    const double unit = (mx - mn) / levels;
    const double bound = unit * (0.5 + 4 * levels * 0x1p-24) +
                         0x1p-23 * std::max(std::fabs(mn), std::fabs(mx)) + 0x1p-149 * (levels + 1);
    for (int64_t i = s; i < e; ++i) {
      if (i >= quantized) {
        ASSERT_EQ(x[i], y[i]) << "raw tail element " << i;
      } else {
        ASSERT_LE(std::fabs(double(y[i]) - double(x[i])), bound)
            << "element " << i << " bits " << bits << " bucket " << bucket;
      }
    }
  }
}

TEST(CodecProperty, WireSizeAndErrorBound) {
  const int64_t sizes[] = {0, 1, 7, 8, 9, 100, 511, 512, 513, 1000, 4099, 70001};
  const int64_t buckets[] = {1, 3, 8, 100, 512, 1024};
  for (int bits = 1; bits <= 8; ++bits) {
    for (int64_t n : sizes) {
      for (int64_t bucket : buckets) {
        for (bool raw : {false, true}) {
          CodecParams p;
          p.bits = bits;
          p.bucket_size = bucket;
          p.skip_incomplete_buckets = raw;
          auto x = normal_floats(size_t(n), uint32_t(n * 31 + bits), 3.0f, 1.0f);
          auto enc = encode_vec(x, p);
          const int64_t nq = raw ? n - n % bucket : n;
          const size_t want = 24 + 8 * size_t((nq + bucket - 1) / bucket) +
                              size_t((nq * bits + 7) / 8) + size_t(n - nq) * 4;
          ASSERT_EQ(enc.size(), want) << "n " << n << " bits " << bits << " bucket " << bucket;
          std::vector<float> y(size_t(n), -7.0f);
          decode(enc.data(), enc.size(), y.data(), DType::kFloat32, n);
          expect_within_bound(x, y, bits, bucket, nq);
          std::vector<float> acc = normal_floats(size_t(n), 99);
          std::vector<float> want_acc(acc);
          for (size_t i = 0; i < acc.size(); ++i) want_acc[i] += y[i];
          decode_add(enc.data(), enc.size(), acc.data(), DType::kFloat32, n);
          ASSERT_EQ(acc, want_acc);
        }
      }
    }
  }
}

TEST(CodecProperty, SameBytesAcrossThreadsAndInstructionSets) {
  auto x = normal_floats(3 << 20, 5);  // several spans
  for (int variant = 0; variant < 4; ++variant) {
    CodecParams p;
    p.bits = variant < 2 ? 5 : 2;
    p.bucket_size = 100;  // spans of whole buckets, 8-aligned: 800-element steps
    p.rounding = variant % 2 ? Rounding::kStochastic : Rounding::kNearest;
    p.clip = variant >= 2;  // the clipped range's fp64 sums: the same on every ISA
    p.seed = 17;
    set_num_threads(1);
    kernels::set_isa(false);
    auto ref = encode_vec(x, p);
    std::vector<float> ref_out(x.size());
    decode(ref.data(), ref.size(), ref_out.data(), DType::kFloat32, int64_t(x.size()));
    kernels::set_isa(true);
    set_num_threads(4);
    EXPECT_EQ(encode_vec(x, p), ref);
    std::vector<float> out(x.size());
    decode(ref.data(), ref.size(), out.data(), DType::kFloat32, int64_t(x.size()));
    EXPECT_EQ(out, ref_out);
  }
  set_num_threads(2);
}

TEST(CodecProperty, ExtremeRanges) {
  CodecParams p;
  p.bits = 4;
  p.bucket_size = 4;
  // Huge range (max - min overflows fp32), denormals, a constant bucket, a bucket of zeros.
  std::vector<float> x = {-3e38f, 3e38f, 1e38f, 0.f,  1e-40f, 3e-41f, -2e-42f, 7e-45f,
                          2.5f,   2.5f,  2.5f,  2.5f, 0.f,    0.f,    0.f,     0.f};
  auto enc = encode_vec(x, p);
  std::vector<float> y(x.size());
  decode(enc.data(), enc.size(), y.data(), DType::kFloat32, int64_t(x.size()));
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
  expect_within_bound(x, y, 4, 4, 16);
  for (int i = 8; i < 16; ++i) EXPECT_EQ(y[i], x[i]);
}

TEST(CodecProperty, HalfAndBFloat16InputsMatchFloatInput) {
  // fp16 / bf16 inputs are converted exactly, so they encode like the same values in fp32.
  std::vector<uint16_t> half = {0x0000, 0x0001, 0x03ff, 0x3c00, 0xbc00, 0x7bff, 0xfbff, 0x3555};
  std::vector<float> as_float;
  for (uint16_t h : half) as_float.push_back(half_to_float(h));
  CodecParams p;
  p.bits = 6;
  p.bucket_size = 3;
  std::vector<uint8_t> from_half(encoded_size(8, DType::kFloat16, p));
  encode(half.data(), DType::kFloat16, 8, p, from_half.data(), from_half.size());
  auto from_float = encode_vec(as_float, p);
  from_half[5] = 0;  // dtype byte is the only difference
  EXPECT_EQ(from_half, from_float);
}

TEST(CodecProperty, HalfConversionRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = half_to_float(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
    } else {
      ASSERT_EQ(float_to_half(f), h) << h;
    }
  }
  EXPECT_EQ(float_to_half(65520.f), 0x7c00);  // rounds to Inf
  EXPECT_EQ(float_to_half(65519.f), 0x7bff);
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);  // tie to even
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);
}

TEST(CodecProperty, StochasticRoundingIsUnbiased) {
  // One value at 0.3 of the way between two levels: E[decoded] = value. Over N seeds the mean
  // error's standard deviation is unit * sqrt(0.3 * 0.7 / N); allow 5 sigma.
  std::vector<float> x(1024);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 2);  // bucket min 0, max 1
  x[1] = 0.0f;
  x[2] = 1.0f;
  for (size_t i = 3; i < x.size(); ++i) x[i] = 0.3f / 3.0f;  // 0.3 of a 2-bit unit (1/3)
  CodecParams p;
  p.bits = 2;
  p.bucket_size = 1024;
  p.rounding = Rounding::kStochastic;
  double sum_err = 0.0;
  int64_t count = 0;
  const int seeds = 64;
  std::vector<float> y(x.size());
  for (int s = 0; s < seeds; ++s) {
    p.seed = uint64_t(s);
    auto enc = encode_vec(x, p);
    decode(enc.data(), enc.size(), y.data(), DType::kFloat32, int64_t(x.size()));
    for (size_t i = 3; i < x.size(); ++i) {
      sum_err += double(y[i]) - double(x[i]);
      ++count;
    }
  }
  const double unit = 1.0 / 3.0;
  const double sigma = unit * std::sqrt(0.3 * 0.7 / double(count));
  EXPECT_LT(std::fabs(sum_err / double(count)), 5 * sigma);
  // Nearest rounding is biased here by 0.3 unit: the test can tell the two apart.
  p.rounding = Rounding::kNearest;
  auto enc = encode_vec(x, p);
  decode(enc.data(), enc.size(), y.data(), DType::kFloat32, int64_t(x.size()));
  EXPECT_NEAR(double(y[5]) - double(x[5]), -0.3 * unit, 1e-6);
}

}  // namespace
}  // namespace cgx
