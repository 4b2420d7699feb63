// Every registered compressor, generically: sizes, round trips into every dtype, decode_add as
// one rounding of the fp32 sum, determinism, and no crash or out-of-bounds read on truncated or
// corrupted payloads (run under the sanitizer build too). Per-compressor error bounds and golden
// bytes are in tests/test_compressors.py and the compressor's own test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "compressors/registry.h"
#include "core/error.h"

namespace cgx {
namespace {

std::vector<uint8_t> make_input(int64_t n, DType t, uint32_t seed) {
  std::vector<uint8_t> buf(size_t(n) * elem_size(t));
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) store_from_float(buf.data(), t, i, d(gen) * (1 + i % 7));
  return buf;
}

std::vector<uint8_t> encode_all(const Compressor& c, const std::vector<uint8_t>& in, DType t,
                                int64_t n, EncodeContext ctx) {
  std::vector<uint8_t> out(c.max_encoded_size(n, t));
  out.resize(c.encode(in.data(), t, n, ctx, out.data(), out.size()));
  return out;
}

class EveryCompressor : public testing::TestWithParam<std::string> {};

TEST_P(EveryCompressor, SizesRoundTripsAndDecodeAdd) {
  auto c = make_compressor(GetParam());
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t n : {0, 1, 7, 1000, 4099}) {
      auto in = make_input(n, t, uint32_t(n + 3));
      EncodeContext ctx{5, 6, 7};
      auto p = encode_all(*c, in, t, n, ctx);
      if (c->traits().fixed_size) {
        EXPECT_EQ(p.size(), c->max_encoded_size(n, t));
      }
      EXPECT_LE(p.size(), c->max_encoded_size(n, t));
      EXPECT_EQ(c->payload_count(p.data(), p.size()), n);
      EXPECT_EQ(p, encode_all(*c, in, t, n, ctx)) << "encode is not deterministic";
      const size_t un = static_cast<size_t>(n);
      std::vector<float> dec(un), acc(un), want(un);
      c->decode(p.data(), p.size(), dec.data(), DType::kFloat32, n, false);
      for (int64_t i = 0; i < n; ++i) acc[size_t(i)] = want[size_t(i)] = float(i % 5) - 2;
      c->decode(p.data(), p.size(), acc.data(), DType::kFloat32, n, true);
      for (int64_t i = 0; i < n; ++i) {
        want[size_t(i)] += dec[size_t(i)];
        ASSERT_EQ(std::isnan(acc[size_t(i)]), std::isnan(want[size_t(i)]));
        if (!std::isnan(want[size_t(i)])) {
          ASSERT_EQ(acc[size_t(i)], want[size_t(i)]) << i;
        }
      }
      for (DType o : {DType::kFloat16, DType::kBFloat16}) {
        std::vector<uint8_t> low(static_cast<size_t>(n) * 2);
        c->decode(p.data(), p.size(), low.data(), o, n, false);
        for (int64_t i = 0; i < n; ++i) {
          const float want_i = load_as_float(&dec[0], DType::kFloat32, i);
          uint8_t tmp[4];
          store_from_float(tmp, o, 0, want_i);
          ASSERT_EQ(std::memcmp(tmp, low.data() + 2 * i, 2), 0) << "one rounding to " << int(o);
        }
      }
    }
  }
}

TEST_P(EveryCompressor, BadPayloadsRaiseAndNeverReadOutOfBounds) {
  auto c = make_compressor(GetParam());
  const int64_t n = 777;
  auto in = make_input(n, DType::kFloat32, 9);
  auto p = encode_all(*c, in, DType::kFloat32, n, EncodeContext{1, 2, 3});
  std::vector<float> out(static_cast<size_t>(n));
  // Every truncation raises.
  for (size_t len : {size_t(0), size_t(5), size_t(31), p.size() / 2, p.size() - 1}) {
    std::vector<uint8_t> cut(p.begin(), p.begin() + std::min(len, p.size()));
    EXPECT_THROW(c->decode(cut.data(), cut.size(), out.data(), DType::kFloat32, n, false),
                 InvalidArgument)
        << len;
  }
  // A wrong element count raises.
  EXPECT_THROW(c->decode(p.data(), p.size(), out.data(), DType::kFloat32, n - 1, false),
               InvalidArgument);
  // Random corruption: raises or decodes, never crashes (ASan / UBSan build checks the reads).
  std::mt19937 gen(1);
  for (int trial = 0; trial < 300; ++trial) {
    auto bad = p;
    const int flips = 1 + int(gen() % 4);
    for (int f = 0; f < flips; ++f) bad[gen() % bad.size()] ^= uint8_t(1u << (gen() % 8));
    try {
      const int64_t m = c->payload_count(bad.data(), bad.size());
      std::vector<float> o(size_t(std::min<int64_t>(m, 1 << 20)));
      if (m == int64_t(o.size())) {
        c->decode(bad.data(), bad.size(), o.data(), DType::kFloat32, m, false);
      }
    } catch (const InvalidArgument&) {
    }
  }
}

TEST(CompressorRegistry, NamesParamsAndErrors) {
  auto names = compressor_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names[0], "maxmin");
  std::set<int> ids;
  for (const auto& e : compressor_registry()) EXPECT_TRUE(ids.insert(e.id).second) << e.name;
  EXPECT_THROW(make_compressor("nope"), InvalidArgument);
  EXPECT_THROW(make_compressor("maxmin", {{"bits", 9}}), InvalidArgument);
  EXPECT_THROW(make_compressor("maxmin", {{"bits", 2.5}}), InvalidArgument);
  EXPECT_THROW(make_compressor("maxmin", {{"bitz", 2}}), InvalidArgument);
  EXPECT_NO_THROW(make_compressor("maxmin", {{"bits", 2}}));
}

INSTANTIATE_TEST_SUITE_P(Registry, EveryCompressor, testing::ValuesIn(compressor_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace cgx
