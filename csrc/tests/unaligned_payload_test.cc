// Received payloads sit at any byte offset of the receive buffer (the algorithms pack payloads of
// odd sizes back to back): every decoder must read them there, and give the same values as
// from an aligned copy. Under the sanitizer build (-DCGX_SANITIZE=ON) a misaligned typed load
// is a UBSan error; the fuzz target found one (a raw fp32 tail read through a float pointer).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "compressors/registry.h"

namespace cgx {
namespace {

std::vector<float> sample(int64_t n) {
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.f, 2.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  return v;
}

void check(const Compressor& c, int64_t n) {
  const std::vector<float> in = sample(n);
  std::vector<uint8_t> payload(c.max_encoded_size(n, DType::kFloat32));
  EncodeContext ctx;
  ctx.seed = 3;
  payload.resize(c.encode(in.data(), DType::kFloat32, n, ctx, payload.data(), payload.size()));
  for (size_t shift : {size_t(1), size_t(3)}) {
    std::vector<uint8_t> odd(payload.size() + shift);
    std::memcpy(odd.data() + shift, payload.data(), payload.size());
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    c.decode(payload.data(), payload.size(), a.data(), DType::kFloat32, n, false);
    c.decode(odd.data() + shift, payload.size(), b.data(), DType::kFloat32, n, false);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << c.name();
    EXPECT_EQ(c.payload_count(odd.data() + shift, payload.size()), n) << c.name();
  }
}

TEST(UnalignedPayload, EveryCompressorDecodesAtAnyOffset) {
  for (const std::string& name : compressor_names()) check(*make_compressor(name), 37);
  // max-min's raw incomplete bucket: fp32 values right after the codes, at an odd offset.
  check(*make_compressor("maxmin",
                         {{"bits", 3}, {"bucket_size", 16}, {"skip_incomplete_buckets", 1}}),
        37);
}

}  // namespace
}  // namespace cgx
