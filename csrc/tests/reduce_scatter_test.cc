// The compressed one-shot reduce-scatter (algorithms/reduce_scatter.h) with ranks as threads:
// the owner's chunk is the exact sum within the bound of one quantization per other rank, for
// chunks that do not fill their last bucket, every dtype and AVG; data-sized payloads; a peer's
// corrupt count or size is refused before anything is decoded or allocated from it.
#include "algorithms/reduce_scatter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "algorithms/error_bound.h"
#include "compressors/registry.h"
#include "core/codec.h"
#include "core/error.h"
#include "fuzz/fuzz_transport.h"
#include "in_memory_transport.h"
#include "ranks.h"
#include "test_values.h"

namespace cgx {
namespace {

struct Case {
  int world;
  int64_t n;  // values per chunk
  int bits;
  int64_t bucket;
  DType dtype;
  bool average;
};

float round_to(float v, DType dtype) {
  uint8_t buf[4];
  store_from_float(buf, dtype, 0, v);
  return load_as_float(buf, dtype, 0);
}

// Every rank's W chunks of n values, rounded to the dtype (what the ranks hold).
std::vector<std::vector<float>> held_inputs(const Case& c) {
  std::vector<std::vector<float>> x;
  for (int r = 0; r < c.world; ++r) {
    auto v = testing::normal_floats(size_t(c.world * c.n), uint32_t(100 + r), 1.0f + float(r));
    for (float& e : v) e = round_to(e, c.dtype);
    x.push_back(v);
  }
  return x;
}

std::vector<uint8_t> as_dtype(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> out(v.size() * elem_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) store_from_float(out.data(), dtype, int64_t(i), v[i]);
  return out;
}

void check_case(const Case& c) {
  SCOPED_TRACE(::testing::Message()
               << "W=" << c.world << " n=" << c.n << " bits=" << c.bits << " bucket=" << c.bucket
               << " dtype=" << int(c.dtype) << " average=" << c.average);
  const auto x = held_inputs(c);
  std::vector<std::vector<float>> out(size_t(c.world), std::vector<float>(size_t(c.n)));
  std::vector<size_t> sent(size_t(c.world));
  testing::Hub hub;
  testing::run_ranks_ok(c.world, [&](int r) {
    testing::InMemoryTransport t(hub, r, c.world);
    AllreduceOptions o;
    o.codec.bits = c.bits;
    o.codec.bucket_size = c.bucket;
    o.average = c.average;
    const std::vector<uint8_t> in = as_dtype(x[size_t(r)], c.dtype);
    CompressedReduceScatter rs;
    rs.run(t, in.data(), c.dtype, c.n, o, out[size_t(r)].data());
    sent[size_t(r)] = rs.bytes_sent();
  });
  CodecParams p;
  p.bits = c.bits;
  p.bucket_size = c.bucket;
  for (int owner = 0; owner < c.world; ++owner) {
    EXPECT_EQ(sent[size_t(owner)], size_t(c.world - 1) * encoded_size(c.n, c.dtype, p) +
                                       size_t(c.world) * sizeof(uint64_t));
    for (int64_t b0 = 0; b0 < c.n; b0 += c.bucket) {
      const int64_t b1 = std::min(c.n, b0 + c.bucket);
      // One quantization of each other rank's bucket: the allgather bound over their ranges.
      double range_sum = 0, magnitude_sum = 0;
      for (int r = 0; r < c.world; ++r) {
        const float* v = x[size_t(r)].data() + owner * c.n;
        const auto [mn, mx] = std::minmax_element(v + b0, v + b1);
        if (r != owner) range_sum += double(*mx) - double(*mn);
        magnitude_sum += std::max(std::fabs(*mn), std::fabs(*mx));
      }
      BoundParams bp;
      bp.bits = c.bits;
      bp.world = c.world;
      bp.algorithm = Algorithm::kAllgather;
      bp.average = c.average;
      const double bound = bucket_error_bound(range_sum, magnitude_sum, bp);
      for (int64_t i = b0; i < b1; ++i) {
        double exact = 0;
        for (int r = 0; r < c.world; ++r) exact += x[size_t(r)][size_t(owner * c.n + i)];
        if (c.average) exact /= c.world;
        ASSERT_LE(std::fabs(out[size_t(owner)][size_t(i)] - exact), bound)
            << "owner " << owner << " value " << i;
      }
    }
  }
}

TEST(ReduceScatter, OwnersChunkIsTheSumWithinOneQuantizationPerRank) {
  for (int world : {2, 3, 4})
    for (int64_t n : {int64_t(1), int64_t(100), int64_t(1000)})
      check_case({world, n, 4, 64, DType::kFloat32, false});
}

TEST(ReduceScatter, UnevenBucketsDtypesAndAverage) {
  check_case({3, 77, 2, 16, DType::kFloat16, true});
  check_case({4, 513, 8, 512, DType::kBFloat16, false});
  check_case({2, 1000, 1, 7, DType::kFloat32, true});
}

TEST(ReduceScatter, EmptyChunksAndOneRank) {
  check_case({3, 0, 4, 64, DType::kFloat32, false});
  testing::Hub hub;
  testing::InMemoryTransport t(hub, 0, 1);
  const std::vector<float> in = {1.5f, -2.0f};
  std::vector<float> out(2);
  AllreduceOptions o;
  o.average = true;
  CompressedReduceScatter().run(t, in.data(), DType::kFloat32, 2, o, out.data());
  EXPECT_EQ(out, in);
}

// A compressor whose payload size depends on the data (threshold), and one that keeps every
// value (topk at ratio 1): then the owner's chunk is its own plus the others', in rank order.
TEST(ReduceScatter, DataSizedPayloadsAndALosslessCompressor) {
  const int world = 3;
  const int64_t n = 300;
  for (const char* name : {"threshold", "topk"}) {
    SCOPED_TRACE(name);
    const auto comp = std::string(name) == "topk" ? make_compressor("topk", {{"ratio", 1.0}})
                                                  : make_compressor("threshold", {{"tau", 0.5}});
    const Case c{world, n, 4, 512, DType::kFloat32, false};
    const auto x = held_inputs(c);
    std::vector<std::vector<float>> out(world, std::vector<float>(size_t(n)));
    testing::Hub hub;
    testing::run_ranks_ok(world, [&](int r) {
      testing::InMemoryTransport t(hub, r, world);
      AllreduceOptions o;
      o.compressor = comp.get();
      CompressedReduceScatter().run(t, x[size_t(r)].data(), DType::kFloat32, n, o,
                                    out[size_t(r)].data());
    });
    for (int owner = 0; owner < world; ++owner) {
      for (int64_t i = 0; i < n; ++i) {
        float want = x[size_t(owner)][size_t(owner * n + i)];
        for (int r = 0; r < world; ++r) {
          const float v = x[size_t(r)][size_t(owner * n + i)];
          // threshold sends |v| >= tau exactly and drops the rest.
          if (r != owner && (std::string(name) == "topk" || std::fabs(v) >= 0.5f)) want += v;
        }
        ASSERT_EQ(out[size_t(owner)][size_t(i)], want) << "owner " << owner << " value " << i;
      }
    }
  }
}

// Rank 0's second alltoallv carries rank 1's payload first: corrupt its count (max-min header
// offset 16, the envelope's offset 8) or, in the first alltoallv, the size rank 1 announces.
void expect_rank0_refuses(const Compressor* comp, int call, size_t offset, uint8_t mask) {
  const int world = 2;
  const int64_t n = 200;
  testing::Hub hub;
  const auto x = testing::normal_floats(size_t(world * n), 5);
  const auto errors = testing::run_ranks(world, [&](int r) {
    testing::InMemoryTransport inner(hub, r, world);
    testing::CorruptingTransport t(inner, r == 0 ? call : -1, offset, mask);
    AllreduceOptions o;
    o.compressor = comp;
    std::vector<float> mine(static_cast<size_t>(n));
    CompressedReduceScatter().run(t, x.data(), DType::kFloat32, n, o, mine.data());
  });
  ASSERT_TRUE(errors[0]) << "rank 0 accepted a corrupt payload";
  EXPECT_THROW(std::rethrow_exception(errors[0]), InvalidArgument);
  EXPECT_FALSE(errors[1]);
}

TEST(ReduceScatter, ACorruptCountOrSizeIsRefused) {
  expect_rank0_refuses(nullptr, 1, 16, 0x01);  // max-min count n ^ 1
  expect_rank0_refuses(nullptr, 1, 21, 0x40);  // max-min count + 2^46
  for (const char* name : {"dgc", "graddrop", "topk", "qsgd"}) {
    SCOPED_TRACE(name);
    const auto comp = make_compressor(name);
    expect_rank0_refuses(comp.get(), 1, 8 + 3, 0x7a);  // a count near 2e9, as in the issue
  }
}

// A peer that announces a payload larger than any of `count` values: refused before the
// receive buffer is sized from it (the peer itself then times out in its exchange, as it would
// against any rank that stops).
TEST(ReduceScatter, AnOversizedAnnouncementIsRefusedBeforeAllocating) {
  const int64_t n = 200;
  const uint64_t announced = uint64_t(1) << 48;
  std::vector<uint8_t> wire(sizeof announced);
  std::memcpy(wire.data(), &announced, sizeof announced);
  fuzz::FuzzWire t(0, 2, wire.data(), wire.size());
  const auto x = testing::normal_floats(size_t(2 * n), 5);
  std::vector<float> out(static_cast<size_t>(n));
  CompressedReduceScatter rs;
  EXPECT_THROW(rs.run(t, x.data(), DType::kFloat32, n, AllreduceOptions(), out.data()),
               InvalidArgument);
}

}  // namespace
}  // namespace cgx
