// The sparsifying compressors (docs/FORMAT.md, "Sparse compressors"): golden bytes worked out by
// hand, the selection rules against brute force, random-k's shared indices, summability and
// unbiasedness, the sampled-threshold fraction and cap, index validation and parameter errors. The
// generic suite (compressor_suite_test.cc) covers sizes, dtypes, decode_add and fuzzed payloads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compressors/registry.h"
#include "core/error.h"
#include "core/primitives.h"
#include "core/rng.h"
#include "test_values.h"

namespace cgx {
namespace {

using Bytes = std::vector<uint8_t>;
using Params = std::map<std::string, double>;

void put_le(Bytes& b, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b.push_back(uint8_t(v >> (8 * i)));
}

// The 32-byte envelope, field by field.
Bytes envelope(uint8_t id, uint8_t dtype, uint8_t flags, uint64_t count, uint64_t body, uint32_t p0,
               uint32_t p1) {
  Bytes b = {'C', 'G', 'X', 'C', 1, dtype, id, flags};
  put_le(b, count, 8);
  put_le(b, body, 8);
  put_le(b, p0, 4);
  put_le(b, p1, 4);
  return b;
}

Bytes operator+(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Bytes u32s(std::initializer_list<uint32_t> v) {
  Bytes b;
  for (uint32_t x : v) put_le(b, x, 4);
  return b;
}

Bytes encode(const Compressor& c, const std::vector<float>& x, EncodeContext ctx = {}) {
  const int64_t n = int64_t(x.size());
  Bytes out(c.max_encoded_size(n, DType::kFloat32));
  out.resize(c.encode(x.data(), DType::kFloat32, n, ctx, out.data(), out.size()));
  return out;
}

std::vector<float> decode(const Compressor& c, const Bytes& p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), 99.0f);
  c.decode(p.data(), p.size(), out.data(), DType::kFloat32, n, false);
  return out;
}

// The indices of a pair payload.
std::vector<uint32_t> pair_indices(const Bytes& p) {
  uint32_t m;
  std::memcpy(&m, p.data() + 24, 4);
  std::vector<uint32_t> idx(m);
  if (m > 0) std::memcpy(idx.data(), p.data() + 32, 4 * size_t(m));
  return idx;
}

float param1_float(const Bytes& p) {
  uint32_t u;
  std::memcpy(&u, p.data() + 28, 4);
  return bits_float(u);
}

std::vector<float> normal(int64_t n, uint32_t seed) {
  return testing::normal_floats(static_cast<size_t>(n), seed);
}

// x = {0.5, -4, 1, 3, -0.25, 2}; fp32 bits: -4 c0800000, 1 3f800000, 3 40400000, 2 40000000.
const std::vector<float> kX = {0.5f, -4.0f, 1.0f, 3.0f, -0.25f, 2.0f};
const Bytes kM4 = {0, 0, 0x80, 0xc0}, k1 = {0, 0, 0x80, 0x3f}, k3 = {0, 0, 0x40, 0x40},
            k2 = {0, 0, 0, 0x40};

TEST(SparseTopK, GoldenBytesFp32) {
  auto c = make_compressor("topk", {{"ratio", 0.5}});  // k = 3: -4, 3, 2
  const Bytes want = envelope(20, 0, 0, 6, 24, 3, 0) + u32s({1, 3, 5}) + kM4 + k3 + k2;
  const Bytes got = encode(*c, kX);
  EXPECT_EQ(got, want);
  EXPECT_EQ(decode(*c, got, 6), (std::vector<float>{0, -4, 0, 3, 0, 2}));
  EXPECT_EQ(c->max_encoded_size(6, DType::kFloat32), want.size());
}

TEST(SparseTopK, GoldenBytesFp16ValuesTravelInTheInputDtype) {
  auto c = make_compressor("topk", {{"ratio", 0.5}});
  // fp16: 0.5 3800, -4 c400, 1 3c00, 3 4200, -0.25 b400, 2 4000.
  const std::vector<uint16_t> x = {0x3800, 0xc400, 0x3c00, 0x4200, 0xb400, 0x4000};
  Bytes p(c->max_encoded_size(6, DType::kFloat16));
  EXPECT_EQ(p.size(), 32u + 3 * 6);
  p.resize(c->encode(x.data(), DType::kFloat16, 6, {}, p.data(), p.size()));
  const Bytes want =
      envelope(20, 1, 0, 6, 18, 3, 0) + u32s({1, 3, 5}) + Bytes{0, 0xc4, 0, 0x42, 0, 0x40};
  EXPECT_EQ(p, want);
  EXPECT_EQ(decode(*c, p, 6), (std::vector<float>{0, -4, 0, 3, 0, 2}));
}

TEST(SparseTopK, SelectsExactlyTheKLargestMagnitudes) {
  for (double ratio : {0.001, 0.01, 0.3, 1.0}) {
    auto x = normal(3001, 4);
    for (size_t i = 0; i < x.size(); i += 7) x[i] = std::round(x[i]);  // ties
    auto c = make_compressor("topk", {{"ratio", ratio}});
    const Bytes p = encode(*c, x);
    std::vector<uint32_t> order(x.size());
    for (size_t i = 0; i < x.size(); ++i) order[i] = uint32_t(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    const size_t k = size_t(std::ceil(ratio * 3001 - 1e-9));
    order.resize(k);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(pair_indices(p), order) << ratio;
    const auto d = decode(*c, p, 3001);
    for (uint32_t i : order) EXPECT_EQ(d[i], x[i]);
  }
}

TEST(SparseTopK, CountsFromDecimalRatiosAndNanInf) {
  auto c = make_compressor("topk", {{"ratio", 0.07}});  // 0.07 * 100 = 7.000000000000001
  EXPECT_EQ(c->max_encoded_size(100, DType::kFloat32), 32u + 7 * 8);
  EXPECT_EQ(c->max_encoded_size(0, DType::kFloat32), 32u);
  EXPECT_EQ(c->max_encoded_size(1, DType::kFloat32), 32u + 8);  // at least one
  auto c2 = make_compressor("topk", {{"ratio", 0.4}});          // k = 2 of 5: NaN, then -Inf
  const auto d = decode(*c2, encode(*c2, {1, NAN, -INFINITY, 2, 0.5f}), 5);
  EXPECT_TRUE(std::isnan(d[1]));
  EXPECT_EQ(d[2], -INFINITY);
  EXPECT_EQ(d[0] + d[3] + d[4], 0.0f);
  const auto t = c->traits();
  EXPECT_TRUE(t.biased && t.sparse && t.fixed_size && !t.summable);
}

TEST(SparseRandomK, GoldenBytesAndScale) {
  const EncodeContext ctx{11, 12, 22};
  const RngKey key = rng_key(11, 22);  // from (seed, shared): stream plays no part
  const auto idx = prim::random_k(6, 3, key);
  for (int scale : {0, 1}) {
    auto c = make_compressor("randomk", {{"ratio", 0.5}, {"scale", scale}});
    Bytes want = envelope(21, 0, uint8_t(scale), 6, 12, key.k0, key.k1);
    std::vector<float> dec(6, 0.0f);
    for (uint32_t i : idx) {
      put_le(want, float_bits(kX[i]), 4);
      dec[i] = kX[i] * (scale ? 2.0f : 1.0f);  // n / k = 2
    }
    const Bytes got = encode(*c, kX, ctx);
    EXPECT_EQ(got, want);
    EXPECT_EQ(got, encode(*c, kX, EncodeContext{11, 99, 22}));
    EXPECT_EQ(decode(*c, got, 6), dec);
    EXPECT_EQ(c->traits().biased, scale == 0);
    EXPECT_TRUE(c->traits().summable && c->traits().sparse && c->traits().fixed_size);
    auto other = make_compressor("randomk", {{"ratio", 0.5}, {"scale", 1 - scale}});
    EXPECT_THROW(decode(*other, got, 6), InvalidArgument);
  }
}

// The positions a random-k payload fills (the input has no zeros).
std::vector<size_t> filled(const std::vector<float>& d) {
  std::vector<size_t> at;
  for (size_t i = 0; i < d.size(); ++i)
    if (d[i] != 0) at.push_back(i);
  return at;
}

TEST(SparseRandomK, SharedIndicesAndValueWiseSum) {
  auto c = make_compressor("randomk", {{"ratio", 0.01}});
  std::vector<float> a(1000), b(1000);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 1.0f + float(i), b[i] = -0.5f - float(i % 13);
  const Bytes pa = encode(*c, a, {1, 100, 5}), pb = encode(*c, b, {1, 200, 5});
  const auto da = decode(*c, pa, 1000), db = decode(*c, pb, 1000);
  EXPECT_EQ(filled(da).size(), 10u);
  EXPECT_EQ(filled(da), filled(db));  // same (seed, shared), other data and stream
  EXPECT_NE(filled(da), filled(decode(*c, encode(*c, a, {1, 100, 6}), 1000)));
  EXPECT_NE(filled(da), filled(decode(*c, encode(*c, a, {2, 100, 5}), 1000)));
  ASSERT_TRUE(std::equal(pa.begin(), pa.begin() + 32, pb.begin()));  // identical envelopes
  Bytes sum = pa;  // the in-transit reduction: fp32 values summed one by one
  for (size_t off = 32; off < sum.size(); off += 4) {
    float va, vb;
    std::memcpy(&va, pa.data() + off, 4);
    std::memcpy(&vb, pb.data() + off, 4);
    const float s = va + vb;
    std::memcpy(sum.data() + off, &s, 4);
  }
  const auto ds = decode(*c, sum, 1000);
  for (size_t i = 0; i < ds.size(); ++i) EXPECT_EQ(ds[i], da[i] + db[i]) << i;
}

TEST(SparseRandomK, ScaledIsUnbiased) {
  auto c = make_compressor("randomk", {{"ratio", 0.25}, {"scale", 1}});  // k = 5 of 20
  const int n = 20, streams = 4000;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[size_t(i)] = float(i) - 9.5f;
  std::vector<double> mean(n, 0.0);
  for (int s = 0; s < streams; ++s) {
    const auto d = decode(*c, encode(*c, x, {3, 0, uint64_t(s)}), n);
    for (int i = 0; i < n; ++i) mean[size_t(i)] += d[size_t(i)] / double(streams);
  }
  for (int i = 0; i < n; ++i) {
    // decode_i = x_i * (n / k) with probability k / n: variance x_i^2 (n / k - 1).
    const double sigma = std::fabs(x[size_t(i)]) * std::sqrt((20.0 / 5 - 1) / streams);
    EXPECT_NEAR(mean[size_t(i)], x[size_t(i)], 5 * sigma) << i;
  }
}

TEST(SparseThreshold, GoldenBytesAndExactRule) {
  auto c = make_compressor("threshold", {{"tau", 1.0}});  // |x| >= 1: -4, 1, 3, 2
  const Bytes want =
      envelope(22, 0, 0, 6, 32, 4, 0x3f800000) + u32s({1, 2, 3, 5}) + kM4 + k1 + k3 + k2;
  const Bytes got = encode(*c, kX);
  EXPECT_EQ(got, want);
  EXPECT_EQ(decode(*c, got, 6), (std::vector<float>{0, -4, 1, 3, 0, 2}));
  auto x = normal(5000, 7);
  x[10] = NAN, x[11] = INFINITY, x[12] = -1.0f;
  std::vector<uint32_t> brute;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::isnan(x[i]) || std::fabs(x[i]) >= 1.0f) brute.push_back(uint32_t(i));
  const Bytes p = encode(*c, x);
  EXPECT_EQ(pair_indices(p), brute);
  EXPECT_TRUE(std::isnan(decode(*c, p, 5000)[10]));
  EXPECT_EQ(c->max_encoded_size(5000, DType::kFloat32), 32u + 5000 * 8);
  EXPECT_EQ(pair_indices(encode(*make_compressor("threshold", {{"tau", 0}}), kX)).size(), 6u);
  EXPECT_FALSE(c->traits().fixed_size);
}

TEST(SparseDgc, GoldenBytesExactThresholdAndCap) {
  auto c = make_compressor("dgc", {{"ratio", 0.3}});  // k = 2, n <= 1024: thr = 3 exactly
  const Bytes want = envelope(23, 0, 0, 6, 16, 2, 0x40400000) + u32s({1, 3}) + kM4 + k3;
  const Bytes got = encode(*c, kX, {5, 6, 7});
  EXPECT_EQ(got, want);
  EXPECT_EQ(decode(*c, got, 6), (std::vector<float>{0, -4, 0, 3, 0, 0}));
  // k = 2, cap 4, thr = 1 passes 5 values: the 4 largest (ties: lower index) are kept.
  auto c2 = make_compressor("dgc", {{"ratio", 0.2}});
  const Bytes ones = {0, 0, 0x80, 0x3f}, minus = {0, 0, 0x80, 0xbf};
  const Bytes want2 =
      envelope(23, 0, 0, 6, 32, 4, 0x3f800000) + u32s({0, 1, 2, 3}) + ones + minus + ones + ones;
  EXPECT_EQ(encode(*c2, {1, -1, 1, 1, -1, 0.5f}), want2);
}

TEST(SparseGradDrop, GoldenBytes) {
  auto c = make_compressor("graddrop", {{"drop", 0.5}});  // keep k = 3: thr = 2
  const Bytes want = envelope(24, 0, 0, 6, 24, 3, 0x40000000) + u32s({1, 3, 5}) + kM4 + k3 + k2;
  const Bytes got = encode(*c, kX);
  EXPECT_EQ(got, want);
  EXPECT_EQ(decode(*c, got, 6), (std::vector<float>{0, -4, 0, 3, 0, 2}));
}

// About k = ceil(fraction n) sent (within 2x), never more than 2k, and exactly the values at or
// above the threshold the payload reports (unless capped: then the cap largest).
void check_sampled_fraction(const std::string& name, const Params& params, double fraction) {
  const int64_t n = 1 << 20;
  const auto x = normal(n, 21);
  auto c = make_compressor(name, params);
  const int64_t k = int64_t(std::ceil(fraction * double(n) - 1e-6));
  for (uint64_t stream : {1, 2, 3}) {
    const Bytes p = encode(*c, x, {8, stream, 0});
    const auto idx = pair_indices(p);
    EXPECT_GE(int64_t(idx.size()), k / 2) << name << " stream " << stream;
    EXPECT_LE(int64_t(idx.size()), 2 * k) << name << " stream " << stream;
    EXPECT_EQ(p.size(), 32 + idx.size() * 8);
    EXPECT_LE(p.size(), c->max_encoded_size(n, DType::kFloat32));
    const float thr = param1_float(p);
    size_t above = 0;
    for (float v : x) above += std::fabs(v) >= thr;
    if (int64_t(above) <= 2 * k) {
      EXPECT_EQ(above, idx.size());
    }
    for (uint32_t i : idx) EXPECT_GE(std::fabs(x[i]), thr);
  }
  EXPECT_FALSE(c->traits().fixed_size);
  EXPECT_TRUE(c->traits().biased && c->traits().sparse);
}

TEST(SparseDgc, KeepsAboutTheRequestedFraction) {
  check_sampled_fraction("dgc", {{"ratio", 0.01}}, 0.01);
  check_sampled_fraction("dgc", {}, 0.001);
}

TEST(SparseGradDrop, KeepsAboutTheRequestedFraction) {
  check_sampled_fraction("graddrop", {{"drop", 0.99}}, 0.01);
  check_sampled_fraction("graddrop", {}, 0.001);
}

// Decoding `p` raises InvalidArgument whose message holds `what` and the compressor's name.
void expect_invalid(const Compressor& c, const Bytes& p, int64_t n, const std::string& what) {
  std::vector<float> out(static_cast<size_t>(n));
  try {
    c.decode(p.data(), p.size(), out.data(), DType::kFloat32, n, false);
    ADD_FAILURE() << "no error for " << what;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.name()), std::string::npos) << e.what();
  }
}

TEST(SparsePairs, CorruptIndicesRaise) {
  const std::map<std::string, Params> params = {{"topk", {{"ratio", 0.5}}},
                                                {"threshold", {{"tau", 1.0}}},
                                                {"dgc", {{"ratio", 0.5}}},
                                                {"graddrop", {{"drop", 0.5}}}};
  for (const auto& [name, p] : params) {
    auto c = make_compressor(name, p);
    const Bytes good = encode(*c, kX);
    ASSERT_GE(pair_indices(good).size(), 3u) << name;
    Bytes bad = good;
    bad[36] = bad[32];  // index 1 == index 0
    expect_invalid(*c, bad, 6, "ascending");
    bad = good;
    bad[32] = 4;  // index 0 above index 1
    expect_invalid(*c, bad, 6, "ascending");
    bad = good;
    bad[40] = 6;  // index 2 == count
    expect_invalid(*c, bad, 6, "out of range");
    bad = good;
    bad[43] = 0x80;  // index 2 huge
    expect_invalid(*c, bad, 6, "out of range");
    bad = good;
    bad[24] += 1;  // one pair more than the body holds
    EXPECT_THROW(decode(*c, bad, 6), InvalidArgument) << name;
    bad = good;
    bad[7] = 2;  // flags
    expect_invalid(*c, bad, 6, "flags");
  }
}

TEST(SparsePairs, DecodeAddLeavesTheRestUntouched) {
  auto c = make_compressor("topk", {{"ratio", 0.5}});
  const Bytes p = encode(*c, kX);
  std::vector<float> acc = {7, 7, 7, 7, 7, 7};
  c->decode(p.data(), p.size(), acc.data(), DType::kFloat32, 6, true);
  EXPECT_EQ(acc, (std::vector<float>{7, 3, 7, 10, 7, 9}));
}

TEST(SparsePairs, CountsAboveU32Raise) {
  const int64_t big = int64_t(1) << 32;
  float dummy[4] = {};
  for (const char* name : {"topk", "randomk", "threshold", "dgc", "graddrop"}) {
    auto c = make_compressor(name);
    Bytes out(64);
    try {
      c->encode(dummy, DType::kFloat32, big, {}, out.data(), out.size());
      ADD_FAILURE() << name;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("exceeds 2^32 - 1"), std::string::npos) << e.what();
    }
    const uint8_t id = uint8_t(compressor_entry(name).id);
    const Bytes p = envelope(id, 0, 0, uint64_t(big), 0, 0, 0);
    EXPECT_EQ(c->payload_count(p.data(), p.size()), big);
    try {
      c->decode(p.data(), p.size(), dummy, DType::kFloat32, big, false);
      ADD_FAILURE() << name;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("exceeds 2^32 - 1"), std::string::npos) << e.what();
    }
  }
}

TEST(SparseParams, BadValuesRaise) {
  const std::vector<std::pair<std::string, Params>> bad = {
      {"topk", {{"ratio", 0}}},           {"topk", {{"ratio", 2}}},
      {"topk", {{"ratoi", 0.1}}},         {"randomk", {{"ratio", 0}}},
      {"randomk", {{"scale", 0.5}}},      {"randomk", {{"scale", 2}}},
      {"threshold", {{"tau", -1}}},       {"dgc", {{"ratio", 0}}},
      {"dgc", {{"sample_rate", 0}}},      {"dgc", {{"ratio", 1.5}}},
      {"graddrop", {{"drop", 1}}},        {"graddrop", {{"drop", -0.1}}},
      {"graddrop", {{"sample_rate", 0}}}, {"topkk", {}}};
  for (const auto& [name, params] : bad) {
    EXPECT_THROW(make_compressor(name, params), InvalidArgument) << name;
  }
  EXPECT_NO_THROW(make_compressor("topk", {{"ratio", 1}}));
  EXPECT_NO_THROW(make_compressor("graddrop", {{"drop", 0}}));
  EXPECT_NO_THROW(make_compressor("threshold", {{"tau", 0}}));
  EXPECT_EQ(compressor_entry("topk").id, 20);
  EXPECT_EQ(compressor_entry("randomk").id, 21);
  EXPECT_EQ(compressor_entry("threshold").id, 22);
  EXPECT_EQ(compressor_entry("dgc").id, 23);
  EXPECT_EQ(compressor_entry("graddrop").id, 24);
}

}  // namespace
}  // namespace cgx
