// The SparseLoCo-style compressor (docs/FORMAT.md, "sparseloco"): golden bytes worked out by hand
// (2-bit and 1-bit codes, u16 and u32 indices), the selection against brute force, the round-trip
// bound from the definition (kept values within d / 2 of their level, the rest 0), NaN / Inf
// confined to their chunk, and every validation error. The generic suite
// (compressor_suite_test.cc) covers dtypes, odd sizes, decode_add and fuzzed payloads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "compressors/registry.h"
#include "core/error.h"
#include "test_values.h"

namespace cgx {
namespace {

using Bytes = std::vector<uint8_t>;
using Params = std::map<std::string, double>;

void put_le(Bytes& b, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b.push_back(uint8_t(v >> (8 * i)));
}

Bytes envelope(uint64_t count, uint64_t body, uint32_t chunk, uint32_t bits) {
  Bytes b = {'C', 'G', 'X', 'C', 1, 0, 25, 0};
  put_le(b, count, 8);
  put_le(b, body, 8);
  put_le(b, chunk, 4);
  put_le(b, bits, 4);
  return b;
}

Bytes operator+(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Bytes f32s(std::initializer_list<float> v) {
  Bytes b;
  for (float x : v) put_le(b, float_bits(x), 4);
  return b;
}

Bytes uints(std::initializer_list<uint32_t> v, int bytes) {
  Bytes b;
  for (uint32_t x : v) put_le(b, x, bytes);
  return b;
}

Bytes encode(const Compressor& c, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size());
  Bytes out(c.max_encoded_size(n, DType::kFloat32));
  out.resize(c.encode(x.data(), DType::kFloat32, n, {}, out.data(), out.size()));
  EXPECT_EQ(out.size(), c.max_encoded_size(n, DType::kFloat32));  // fixed size
  return out;
}

std::vector<float> decode(const Compressor& c, const Bytes& p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), 99.0f);
  c.decode(p.data(), p.size(), out.data(), DType::kFloat32, n, false);
  return out;
}

std::unique_ptr<Compressor> make(double ratio, double chunk, double bits) {
  return make_compressor("sparseloco", {{"ratio", ratio}, {"chunk", chunk}, {"bits", bits}});
}

// Chunk 0 = {0.5, -2, 1, 0.25} keeps k(0.5, 4) = 2: -2 (index 1) and 1 (index 2); chunk 1 =
// {3, -1} keeps k(0.5, 2) = 1: 3 (index 0).
const std::vector<float> kX = {0.5f, -2.0f, 1.0f, 0.25f, 3.0f, -1.0f};

TEST(SparseLoCo, GoldenBytesTwoBits) {
  // Chunk 0: |kept| in [1, 2]: a = 1, d = (2 - 1) / 1 = 1; -2 -> sign 1, level 1 (code 3);
  // 1 -> level 0 (code 0). Chunk 1: a = 3, d = 0 -> code 0. Codes 3, 0, 0 -> byte 0x03.
  auto c = make(0.5, 4, 2);
  const Bytes want =
      envelope(6, 16 + 6 + 1, 4, 2) + f32s({1, 1, 3, 0}) + uints({1, 2, 0}, 2) + Bytes{0x03};
  const Bytes got = encode(*c, kX);
  EXPECT_EQ(got, want);
  EXPECT_EQ(decode(*c, got, 6), (std::vector<float>{0, -2, 1, 0, 3, 0}));
}

TEST(SparseLoCo, GoldenBytesOneBitSendsTheMeanMagnitude) {
  // bits = 1: a = mean |kept| (1.5 in chunk 0, 3 in chunk 1), d = 0; codes are signs: 1, 0, 0.
  auto c = make(0.5, 4, 1);
  const Bytes want =
      envelope(6, 16 + 6 + 1, 4, 1) + f32s({1.5, 0, 3, 0}) + uints({1, 2, 0}, 2) + Bytes{0x01};
  const Bytes got = encode(*c, kX);
  EXPECT_EQ(got, want);
  EXPECT_EQ(decode(*c, got, 6), (std::vector<float>{0, -1.5, 1.5, 0, 3, 0}));
}

TEST(SparseLoCo, GoldenBytesU32IndicesAbove65536) {
  // One chunk of 70000 (u32 indices), 3 values: k = 1 keeps -2 at index 1; 3 bits: a = 2, d = 0,
  // code = sign 4 | level 0 = 0b100.
  auto c = make(0.2, 70000, 3);
  const Bytes want = envelope(3, 8 + 4 + 1, 70000, 3) + f32s({2, 0}) + uints({1}, 4) + Bytes{4};
  const Bytes got = encode(*c, {1, -2, 0.5});
  EXPECT_EQ(got, want);
  EXPECT_EQ(decode(*c, got, 3), (std::vector<float>{0, -2, 0}));
  EXPECT_EQ(make(0.03, 4096, 2)->max_encoded_size(0, DType::kFloat32), 32u);
  // 10000 values in chunks of 4096: k = 123, 123, 55 (of 1808): 3 x 8 + 301 x 2 + 76 bytes.
  EXPECT_EQ(make(0.03, 4096, 2)->max_encoded_size(10000, DType::kFloat32), 32u + 24 + 602 + 76);
}

// The kept indices of each chunk by brute force: the k largest |x|, ties to the lower index.
std::vector<bool> brute_kept(const std::vector<float>& x, double ratio, int64_t chunk) {
  std::vector<bool> kept(x.size(), false);
  for (size_t lo = 0; lo < x.size(); lo += size_t(chunk)) {
    const size_t hi = std::min(x.size(), lo + size_t(chunk));
    std::vector<size_t> order;
    for (size_t i = lo; i < hi; ++i) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    const size_t k = size_t(std::ceil(ratio * double(hi - lo) - 1e-6));
    for (size_t j = 0; j < std::max<size_t>(k, 1); ++j) kept[order[j]] = true;
  }
  return kept;
}

TEST(SparseLoCo, RoundTripWithinTheBoundOfItsDefinition) {
  const int64_t chunk = 512;
  auto x = testing::normal_floats(10000, 3);
  for (size_t i = 0; i < x.size(); i += 11) x[i] = std::round(x[i] * 4) / 4;  // ties
  for (int bits = 1; bits <= 8; ++bits) {
    auto c = make(0.05, double(chunk), bits);
    const auto y = decode(*c, encode(*c, x), int64_t(x.size()));
    const auto kept = brute_kept(x, 0.05, chunk);
    for (size_t lo = 0; lo < x.size(); lo += chunk) {
      const size_t hi = std::min(x.size(), lo + size_t(chunk));
      float mn = INFINITY, mx = 0;
      for (size_t i = lo; i < hi; ++i)
        if (kept[i]) mn = std::min(mn, std::fabs(x[i])), mx = std::max(mx, std::fabs(x[i]));
      // bits >= 2: levels mn + l d, d = (mx - mn) / (2^(bits-1) - 1), nearest: |err| <= d / 2;
      // bits = 1: the mean of [mn, mx] lies in it: |err| <= mx - mn. fp32 slack.
      const float bound = bits == 1 ? mx - mn : (mx - mn) / float((1 << (bits - 1)) - 1) / 2;
      for (size_t i = lo; i < hi; ++i) {
        if (!kept[i]) {
          EXPECT_EQ(y[i], 0.0f) << bits << " " << i;
          continue;
        }
        EXPECT_LE(std::fabs(y[i] - x[i]), bound * 1.0001f + 1e-6f * mx) << bits << " " << i;
        EXPECT_EQ(y[i] < 0, x[i] < 0) << bits << " " << i;
      }
    }
  }
}

TEST(SparseLoCo, NanAndInfDecodeToNanInTheirChunkOnly) {
  auto c = make(0.25, 4, 2);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    const std::vector<float> x = {1, 2, bad, 0.5, 1, -3, 2, 0.5};
    const auto y = decode(*c, encode(*c, x), 8);
    EXPECT_TRUE(std::isnan(y[2]));  // kept first (NaN ranks above +Inf), the chunk's scale NaN
    EXPECT_EQ(y[0] + y[1] + y[3], 0.0f);
    EXPECT_EQ(y[5], -3.0f);  // the other chunk is untouched
  }
}

TEST(SparseLoCo, CorruptPayloadsRaise) {
  auto c = make(0.5, 4, 2);
  const Bytes good = encode(*c, kX);
  auto bad = [&](Bytes p) { EXPECT_THROW(decode(*c, p, 6), InvalidArgument); };
  bad(Bytes(good.begin(), good.end() - 1));  // truncated
  bad(good + Bytes{0});                      // trailing
  Bytes p = good;
  p[7] = 1;  // flags
  bad(p);
  p = good;
  p[24] = 8;  // chunk 8: another compressor's payload
  bad(p);
  p = good;
  p[28] = 3;  // bits 3
  bad(p);
  p = good;
  p[32 + 16] = 4;  // chunk 0's first index = 4, not < 4
  bad(p);
  p = good;
  p[32 + 16 + 2] = 1;  // chunk 0's indices 1, 1: not ascending
  bad(p);
  p = good;
  p[32 + 16 + 4] = 2;  // chunk 1's index 2 of a 2-value chunk
  bad(p);
  EXPECT_THROW(decode(*make(0.25, 4, 2), good, 6), InvalidArgument);  // k = 1: body size
  EXPECT_THROW(decode(*c, good, 7), InvalidArgument);                 // other count
  p = good;
  p[8] = 200;  // count 200: the body does not match it (payload_count checks it, not trusted)
  EXPECT_THROW(c->payload_count(p.data(), p.size()), InvalidArgument);
  EXPECT_EQ(c->payload_count(good.data(), good.size()), 6);
  // Any scalar or code bits decode without an error (no byte is out of range).
  p = good;
  for (size_t i = 32; i < 32 + 16; ++i) p[i] = 0xff;
  p.back() = 0xff;
  EXPECT_NO_THROW(decode(*c, p, 6));
}

TEST(SparseLoCo, ParametersAreValidated) {
  for (const Params& p :
       {Params{{"ratio", 0}}, Params{{"ratio", 1.5}}, Params{{"bits", 0}}, Params{{"bits", 9}},
        Params{{"chunk", 0}}, Params{{"chunk", 2.5}}, Params{{"other", 1}}}) {
    EXPECT_THROW(make_compressor("sparseloco", p), InvalidArgument);
  }
  auto c = make_compressor("sparseloco");
  EXPECT_TRUE(c->traits().biased && c->traits().sparse && c->traits().fixed_size);
  EXPECT_EQ(c->alignment(), 4096);
}

}  // namespace
}  // namespace cgx
