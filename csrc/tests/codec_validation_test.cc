// Decoding never trusts the payload: every header field and the length are checked, and random
// corruption of the body never reads or writes out of bounds (run under CGX_SANITIZE=ON).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/codec.h"
#include "core/error.h"

namespace cgx {
namespace {

std::vector<uint8_t> sample_payload(int64_t n, CodecParams p) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(i % 17) - 8.0f;
  std::vector<uint8_t> out(encoded_size(n, DType::kFloat32, p));
  encode(x.data(), DType::kFloat32, n, p, out.data(), out.size());
  return out;
}

void expect_rejected(const std::vector<uint8_t>& payload, int64_t n, const std::string& what) {
  std::vector<float> out(static_cast<size_t>(n));
  try {
    decode(payload.data(), payload.size(), out.data(), DType::kFloat32, n);
    FAIL() << "accepted a payload with " << what;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(CodecValidation, RejectsBadHeadersAndLengths) {
  CodecParams p;
  p.bits = 3;
  p.bucket_size = 10;
  const auto good = sample_payload(100, p);
  auto bad = good;
  bad[0] = 'X';
  expect_rejected(bad, 100, "bad magic");
  bad = good;
  bad[4] = 2;
  expect_rejected(bad, 100, "format version");
  bad = good;
  bad[5] = 7;
  expect_rejected(bad, 100, "unknown dtype");
  bad = good;
  bad[6] = 9;
  expect_rejected(bad, 100, "bits 9");
  bad = good;
  bad[7] = 0x80;
  expect_rejected(bad, 100, "unknown flags");
  bad = good;
  bad[8] = bad[9] = bad[10] = bad[11] = 0;
  expect_rejected(bad, 100, "bucket size 0");
  bad = good;
  bad[13] = 1;
  expect_rejected(bad, 100, "reserved");
  bad = good;
  bad[23] = 0x40;
  expect_rejected(bad, 100, "exceeds 2^48");
  bad = good;
  bad.pop_back();
  expect_rejected(bad, 100, "truncated");
  bad = good;
  bad.push_back(0);
  expect_rejected(bad, 100, "trailing bytes");
  expect_rejected(std::vector<uint8_t>(good.begin(), good.begin() + 10), 100, "truncated");
  expect_rejected(good, 99, "holds 100 elements");
  bad = good;
  bad[6] = 4;  // more bits than the length holds
  expect_rejected(bad, 100, "truncated");
  bad = good;
  bad[16] = 101;  // a count that disagrees with the length
  expect_rejected(bad, 100, "truncated");
}

TEST(CodecValidation, RejectsBadParams) {
  CodecParams p;
  for (int bits : {0, 9, 31, -1}) {
    p.bits = bits;
    EXPECT_THROW(encoded_size(10, DType::kFloat32, p), InvalidArgument);
  }
  p.bits = 4;
  p.bucket_size = 0;
  EXPECT_THROW(encoded_size(10, DType::kFloat32, p), InvalidArgument);
  p.bucket_size = 512;
  EXPECT_THROW(encoded_size(-1, DType::kFloat32, p), InvalidArgument);
  std::vector<float> x(10);
  std::vector<uint8_t> small(encoded_size(10, DType::kFloat32, p) - 1);
  EXPECT_THROW(encode(x.data(), DType::kFloat32, 10, p, small.data(), small.size()),
               InvalidArgument);
}

TEST(CodecValidation, CorruptBodyDecodesInBounds) {
  CodecParams p;
  p.bits = 5;
  p.bucket_size = 7;
  const auto good = sample_payload(333, p);
  std::mt19937 gen(1);
  for (int trial = 0; trial < 200; ++trial) {
    auto bad = good;
    for (int k = 0; k < 8; ++k) bad[24 + gen() % (bad.size() - 24)] = uint8_t(gen());
    std::vector<float> out(333);
    decode(bad.data(), bad.size(), out.data(), DType::kFloat32, 333);
    decode_add(bad.data(), bad.size(), out.data(), DType::kFloat32, 333);
  }
}

}  // namespace
}  // namespace cgx
