// A received payload whose element count was corrupted (one byte of a dgc payload's count
// can make a 40-byte payload describe 2.06e9 values): every receiver that knows the count it
// expects refuses it (decode() compares), and payload_count() refuses any count the payload's
// body cannot hold (dense compressors: one bit per value at least; max-min: its exact size), so
// a caller that sizes a buffer by it cannot be made to allocate gigabytes. A sparse payload's
// count is not bounded by its body: payload_count() returns it (trusted, docs/FORMAT.md).
#include <gtest/gtest.h>

#include <cstring>

#include "compressors/registry.h"
#include "core/codec.h"
#include "core/error.h"
#include "test_values.h"

namespace cgx {
namespace {

constexpr int64_t kCount = 100;

std::vector<uint8_t> payload_of(const Compressor& c) {
  const auto v = testing::normal_floats(kCount, 3);
  std::vector<uint8_t> p(c.max_encoded_size(kCount, DType::kFloat32));
  p.resize(c.encode(v.data(), DType::kFloat32, kCount, {1, 2, 3}, p.data(), p.size()));
  return p;
}

// The count's third byte XOR 0x7a (100 + 0x7a << 24: about 2.05e9 values).
void corrupt_count(std::vector<uint8_t>& p, size_t count_offset) { p[count_offset + 3] ^= 0x7a; }

TEST(CorruptCount, EveryDecodeGivenTheExpectedCountRefusesIt) {
  for (const std::string& name : compressor_names()) {
    SCOPED_TRACE(name);
    const auto c = make_compressor(name);
    auto p = payload_of(*c);
    corrupt_count(p, name == "maxmin" ? 16 : 8);
    std::vector<float> out(static_cast<size_t>(kCount));
    EXPECT_THROW(c->decode(p.data(), p.size(), out.data(), DType::kFloat32, kCount, false),
                 InvalidArgument);
    EXPECT_THROW(c->decode(p.data(), p.size(), out.data(), DType::kFloat32, kCount, true),
                 InvalidArgument);
  }
}

TEST(CorruptCount, PayloadCountRefusesWhatADenseBodyCannotHold) {
  for (const std::string& name : compressor_names()) {
    SCOPED_TRACE(name);
    const auto c = make_compressor(name);
    auto p = payload_of(*c);
    EXPECT_EQ(c->payload_count(p.data(), p.size()), kCount);
    corrupt_count(p, name == "maxmin" ? 16 : 8);
    // Sparse: trusted, the caller must compare with what it expects; but sparseloco's body size
    // follows from the count (docs/FORMAT.md), so it refuses like the dense ones.
    if (c->traits().sparse && name != "sparseloco") {
      EXPECT_GT(c->payload_count(p.data(), p.size()), int64_t(1) << 30);
    } else {
      EXPECT_THROW(c->payload_count(p.data(), p.size()), InvalidArgument);
    }
  }
}

}  // namespace
}  // namespace cgx
