// Payloads worked out by hand from docs/FORMAT.md, pinning the wire format byte for byte.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/codec.h"
#include "core/error.h"

namespace cgx {
namespace {

std::vector<uint8_t> encode_vec(const void* in, DType dtype, int64_t n, const CodecParams& p) {
  std::vector<uint8_t> out(encoded_size(n, dtype, p));
  encode(in, dtype, n, p, out.data(), out.size());
  return out;
}

std::vector<uint8_t> header(uint8_t dtype, uint8_t bits, uint8_t flags, uint32_t bucket,
                            uint64_t count) {
  std::vector<uint8_t> h = {'C', 'G', 'X', 'Q', 1, dtype, bits, flags};
  for (int i = 0; i < 4; ++i) h.push_back(uint8_t(bucket >> (8 * i)));
  for (int i = 0; i < 4; ++i) h.push_back(0);
  for (int i = 0; i < 8; ++i) h.push_back(uint8_t(count >> (8 * i)));
  return h;
}

void append_f32(std::vector<uint8_t>& v, uint32_t bits) {
  for (int i = 0; i < 4; ++i) v.push_back(uint8_t(bits >> (8 * i)));
}

TEST(CodecGolden, TwoBitsOneBucket) {
  // min 0, max 3, unit 1: codes 0 1 2 3 -> 0b11'10'01'00 = 0xE4.
  const float x[4] = {0.f, 1.f, 2.f, 3.f};
  CodecParams p;
  p.bits = 2;
  p.bucket_size = 4;
  auto want = header(0, 2, 0, 4, 4);
  append_f32(want, 0x00000000);  // min 0.0
  append_f32(want, 0x3f800000);  // unit 1.0
  want.push_back(0xE4);
  EXPECT_EQ(encode_vec(x, DType::kFloat32, 4, p), want);
}

TEST(CodecGolden, ThreeBitsShortLastBucketAndRawTail) {
  // Buckets {-1, 1}, {5, 5}, {0.5}. Bucket 0: unit = 2/7 (f32 0x3e924925), inv = 3.5, codes 0, 7.
  // Buckets 1 and 2 are constant: unit 0, codes 0. Codes 0,7,0,0,0 in 3-bit fields: 7 << 3 = 0x38.
  const float x[5] = {-1.f, 1.f, 5.f, 5.f, 0.5f};
  CodecParams p;
  p.bits = 3;
  p.bucket_size = 2;
  auto want = header(0, 3, 0, 2, 5);
  append_f32(want, 0xbf800000);  // min -1
  append_f32(want, 0x3e924925);  // unit 2/7
  append_f32(want, 0x40a00000);  // min 5
  append_f32(want, 0x00000000);
  append_f32(want, 0x3f000000);  // min 0.5
  append_f32(want, 0x00000000);
  want.push_back(0x38);
  want.push_back(0x00);
  EXPECT_EQ(encode_vec(x, DType::kFloat32, 5, p), want);

  // Same buffer with the incomplete last bucket sent raw (flag bit 0): 4 codes, then 0.5 as f32.
  p.skip_incomplete_buckets = true;
  auto want_raw = header(0, 3, 1, 2, 5);
  want_raw.insert(want_raw.end(), want.begin() + 24, want.begin() + 24 + 16);
  want_raw.push_back(0x38);
  want_raw.push_back(0x00);
  append_f32(want_raw, 0x3f000000);
  EXPECT_EQ(encode_vec(x, DType::kFloat32, 5, p), want_raw);
}

TEST(CodecGolden, BFloat16OneBit) {
  const uint16_t x[2] = {0x3f80, 0x4000};  // bf16 1.0, 2.0: min 1, unit 1, codes 0, 1
  CodecParams p;
  p.bits = 1;
  auto want = header(2, 1, 0, 512, 2);
  append_f32(want, 0x3f800000);
  append_f32(want, 0x3f800000);
  want.push_back(0x02);
  EXPECT_EQ(encode_vec(x, DType::kBFloat16, 2, p), want);
}

TEST(CodecGolden, NonFiniteBucketIsNaNMetadata) {
  const float x[2] = {1.f, INFINITY};
  CodecParams p;
  p.bits = 8;
  auto want = header(0, 8, 0, 512, 2);
  append_f32(want, 0x7fc00000);
  append_f32(want, 0x7fc00000);
  want.push_back(0);
  want.push_back(0);
  auto got = encode_vec(x, DType::kFloat32, 2, p);
  EXPECT_EQ(got, want);
  float out[2];
  decode(got.data(), got.size(), out, DType::kFloat32, 2);
  EXPECT_TRUE(std::isnan(out[0]) && std::isnan(out[1]));
}

TEST(CodecGolden, EmptyBufferIsHeaderOnly) {
  CodecParams p;
  auto got = encode_vec(nullptr, DType::kFloat16, 0, p);
  EXPECT_EQ(got, header(1, 4, 0, 512, 0));
  decode(got.data(), got.size(), nullptr, DType::kFloat16, 0);
}

TEST(CodecGolden, DecodeFollowsTheFormula) {
  const float x[5] = {-1.f, 1.f, 5.f, 5.f, 0.5f};
  CodecParams p;
  p.bits = 3;
  p.bucket_size = 2;
  auto enc = encode_vec(x, DType::kFloat32, 5, p);
  float out[5];
  decode(enc.data(), enc.size(), out, DType::kFloat32, 5);
  const float unit = 2.0f / 7.0f;
  EXPECT_EQ(out[0], -1.f);
  EXPECT_EQ(out[1], -1.f + 7.0f * unit);
  EXPECT_EQ(out[2], 5.f);
  EXPECT_EQ(out[3], 5.f);
  EXPECT_EQ(out[4], 0.5f);
  float acc[5] = {10.f, 10.f, 10.f, 10.f, 10.f};
  decode_add(enc.data(), enc.size(), acc, DType::kFloat32, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(acc[i], 10.f + out[i]);
}

}  // namespace
}  // namespace cgx
