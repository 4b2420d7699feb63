// Golden bytes of the dense quantizers, worked out by hand from docs/FORMAT.md ("Compressor
// payloads"), and the decoded values they must give.
#include <gtest/gtest.h>

#include <cstring>

#include "compressors/registry.h"
#include "core/error.h"

namespace cgx {
namespace {

void append(std::vector<uint8_t>& v, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  v.insert(v.end(), b, b + n);
}

// The 32-byte envelope of FORMAT.md, for fp32 input.
std::vector<uint8_t> envelope(uint8_t id, uint64_t count, uint64_t body, uint32_t p0, uint32_t p1,
                              uint8_t flags = 0) {
  std::vector<uint8_t> v = {'C', 'G', 'X', 'C', 1, 0, id, flags};
  append(v, &count, 8);
  append(v, &body, 8);
  append(v, &p0, 4);
  append(v, &p1, 4);
  return v;
}

void f32(std::vector<uint8_t>& v, float x) { append(v, &x, 4); }

void check(const std::string& name, const std::map<std::string, double>& params,
           const std::vector<float>& x, const std::vector<uint8_t>& want,
           const std::vector<float>& decoded) {
  auto c = make_compressor(name, params);
  std::vector<uint8_t> out(c->max_encoded_size(int64_t(x.size()), DType::kFloat32));
  out.resize(c->encode(x.data(), DType::kFloat32, int64_t(x.size()), EncodeContext{1, 2, 3},
                       out.data(), out.size()));
  EXPECT_EQ(out, want) << name;
  std::vector<float> y(x.size());
  c->decode(want.data(), want.size(), y.data(), DType::kFloat32, int64_t(y.size()), false);
  EXPECT_EQ(y, decoded) << name;
}

TEST(QuantGolden, SignSGD) {
  auto p = envelope(3, 5, 1, 0, 0);
  p.push_back(0x02);  // only element 1 is negative (-0.0 is not)
  check("signsgd", {}, {1.5f, -2.0f, 0.0f, -0.0f, 3.0f}, p, {1, -1, 1, 1, 1});
}

TEST(QuantGolden, OneBit) {
  auto p = envelope(10, 5, 6 * 4 + 1, 2, 0);
  for (float m : {-3.0f, 1.0f, 0.0f, 3.0f, -1.0f, 0.0f}) f32(p, m);  // (neg, pos) per bucket
  p.push_back(0x12);                                                 // negatives at 1 and 4
  check("onebit", {{"bucket_size", 2}}, {1, -3, 2, 4, -1}, p, {1, -3, 3, 3, -1});
}

TEST(QuantGolden, EFSignSGD) {
  auto p = envelope(11, 4, 4 + 1, 0, 0);
  f32(p, 2.5f);  // (1 + 2 + 3 + 4) / 4
  p.push_back(0x0A);
  check("efsignsgd", {}, {1, -2, 3, -4}, p, {2.5f, -2.5f, 2.5f, -2.5f});
}

TEST(QuantGolden, TernGradAtFullMagnitudeIsDeterministic) {
  auto p = envelope(12, 3, 4 + 1, 512, 0);
  f32(p, 2.0f);
  p.push_back(0x09);  // codes 1 (+s), 2 (-s), 0: |x| / s is 1 or 0, whatever u
  check("terngrad", {}, {2, -2, 0}, p, {2, -2, 0});
}

TEST(QuantGolden, QSGDOnItsGrid) {
  auto p = envelope(13, 2, 4 + 1, 512, 4);
  f32(p, 5.0f);       // the l2 norm
  p.push_back(0x0F);  // -5: sign + level 7 (= 0b1111); 0: level 0
  check("qsgd", {}, {-5, 0}, p, {-5, 0});
}

TEST(QuantGolden, TBQ) {
  auto p = envelope(14, 5, 2, 0, 0x3F800000u);  // tau = 1.0f
  p.push_back(0xA4);                            // codes 0, 1, 2, 2 ...
  p.push_back(0x00);                            // ... and 0
  check("tbq", {}, {0.5f, 1.0f, -1.0f, -2.5f, 0.99f}, p, {0, 1, -1, -1, 0});
}

TEST(QuantGolden, InvalidCodesAndFlagsAreRejected) {
  auto c = make_compressor("tbq");
  auto p = envelope(14, 1, 1, 0, 0x3F800000u);
  p.push_back(0x03);  // code 3
  std::vector<float> y(1);
  EXPECT_THROW(c->decode(p.data(), p.size(), y.data(), DType::kFloat32, 1, false), InvalidArgument);
  p.back() = 0;
  p[7] = 0x80;  // unknown flag
  EXPECT_THROW(c->decode(p.data(), p.size(), y.data(), DType::kFloat32, 1, false), InvalidArgument);
  auto q = make_compressor("qsgd");
  auto bad_bits = envelope(13, 1, 4 + 1, 512, 9);
  f32(bad_bits, 1);
  bad_bits.push_back(0);
  EXPECT_THROW(q->decode(bad_bits.data(), bad_bits.size(), y.data(), DType::kFloat32, 1, false),
               InvalidArgument);
}

}  // namespace
}  // namespace cgx
