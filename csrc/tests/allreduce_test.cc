// The compressed allreduce algorithms with ranks as threads: replicas bit-identical, results
// within the error bound of docs/algorithms.md, fusion pieces, odd sizes, every dtype.
#include "algorithms/allreduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <thread>

#include "algorithms/error_bound.h"
#include "core/error.h"
#include "in_memory_transport.h"

namespace cgx {
namespace {

struct Case {
  int world;
  int64_t count;
  Algorithm algorithm;
  int bits;
  int64_t bucket;
  size_t fusion_bytes;
  bool average;
  DType dtype;
  size_t segment_bytes = size_t(8) << 20;
  bool skip_incomplete = false;
  bool stochastic = false;
};

std::vector<std::vector<float>> inputs(int world, int64_t count, uint32_t seed) {
  std::vector<std::vector<float>> x(static_cast<size_t>(world),
                                    std::vector<float>(static_cast<size_t>(count)));
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x)
    for (auto& e : v) e = d(gen);
  return x;
}

// The bound of docs/algorithms.md (error_bound.h) for one bucket [b0, b1) of the ranks' inputs.
double bound(const std::vector<std::vector<float>>& x, int64_t b0, int64_t b1, const Case& c) {
  double r_sum = 0.0, mag = 0.0;
  for (const auto& v : x) {
    double mn = v[size_t(b0)], mx = v[size_t(b0)];
    for (int64_t i = b0; i < b1; ++i) {
      mn = std::min<double>(mn, v[size_t(i)]);
      mx = std::max<double>(mx, v[size_t(i)]);
    }
    r_sum += mx - mn;
    mag += std::max(std::fabs(mn), std::fabs(mx));
  }
  BoundParams p;
  p.bits = c.bits;
  p.world = c.world;
  p.algorithm = c.algorithm;
  p.average = c.average;
  p.rounding = c.stochastic ? Rounding::kStochastic : Rounding::kNearest;
  p.dtype = c.dtype;
  return bucket_error_bound(r_sum, mag, p);
}

void run_case(const Case& c) {
  auto x = inputs(c.world, c.count, uint32_t(c.count * 7 + c.world));
  // The ranks hold x rounded to the dtype; the exact sum is taken of what they hold.
  std::vector<std::vector<uint8_t>> data(size_t(c.world));
  for (int r = 0; r < c.world; ++r) {
    data[size_t(r)].resize(size_t(c.count) * elem_size(c.dtype));
    for (int64_t i = 0; i < c.count; ++i) {
      store_from_float(data[size_t(r)].data(), c.dtype, i, x[size_t(r)][size_t(i)]);
      x[size_t(r)][size_t(i)] = load_as_float(data[size_t(r)].data(), c.dtype, i);
    }
  }
  testing::Hub hub;
  AllreduceOptions o;
  o.codec.bits = c.bits;
  o.codec.bucket_size = c.bucket;
  o.algorithm = c.algorithm;
  o.average = c.average;
  o.fusion_bytes = c.fusion_bytes;
  o.segment_bytes = c.segment_bytes;
  o.codec.skip_incomplete_buckets = c.skip_incomplete;
  o.codec.rounding = c.stochastic ? Rounding::kStochastic : Rounding::kNearest;
  o.codec.seed = 11;
  std::vector<std::thread> threads;
  for (int r = 0; r < c.world; ++r) {
    threads.emplace_back([&, r] {
      testing::InMemoryTransport t(hub, r, c.world);
      CompressedAllreduce ar;
      ar.run(t, data[size_t(r)].data(), c.dtype, c.count, o);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 1; r < c.world; ++r) ASSERT_EQ(data[size_t(r)], data[0]) << "rank " << r;
  // Check each bucket of each piece against the exact sum.
  const int64_t piece = int64_t(c.fusion_bytes / elem_size(c.dtype));
  for (int64_t p0 = 0; p0 < c.count; p0 += piece) {
    const int64_t n = std::min(piece, c.count - p0);
    for (int j = 0; j < c.world; ++j) {
      Range ch = chunk_range(n, c.world, c.bucket, j);
      for (int64_t b0 = ch.begin; b0 < ch.end; b0 += c.bucket) {
        const int64_t b1 = std::min(b0 + c.bucket, ch.end);
        const double tol = bound(x, p0 + b0, p0 + b1, c);
        for (int64_t i = p0 + b0; i < p0 + b1; ++i) {
          double exact = 0.0;
          for (const auto& v : x) exact += v[size_t(i)];
          if (c.average) exact /= c.world;
          const double got = load_as_float(data[0].data(), c.dtype, i);
          ASSERT_LE(std::fabs(got - exact), tol) << "element " << i;
        }
      }
    }
  }
}

TEST(Allreduce, ScatterReduceAllgather) {
  for (int world : {2, 3, 4}) {
    for (int64_t count : {1, 7, 512, 1000, 4099}) {
      for (int bits : {2, 4, 8}) {
        run_case({world, count, Algorithm::kScatterReduceAllgather, bits, 64, 1 << 20, false,
                  DType::kFloat32});
      }
    }
  }
}

TEST(Allreduce, Ring) {
  for (int world : {2, 3, 4}) {
    for (int64_t count : {1, 100, 4099}) {
      run_case({world, count, Algorithm::kRing, 4, 32, 1 << 20, false, DType::kFloat32});
    }
  }
}

TEST(Allreduce, AverageDtypesAndFusionPieces) {
  for (auto alg : {Algorithm::kScatterReduceAllgather, Algorithm::kRing, Algorithm::kTree}) {
    for (auto dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      run_case({3, 10007, alg, 4, 100, 4096, true, dtype});  // pieces of 1024 / 2048 elements
    }
  }
}

TEST(Allreduce, PipelinedSegments) {
  // Segments of 400 / 800 bytes (whole buckets of 100 or 50): many in flight per piece, pieces
  // of 8 KiB, odd sizes, every dtype, 2 to 4 ranks.
  for (int world : {2, 3, 4}) {
    for (auto dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (int64_t count : {1, 999, 20011}) {
        Case c{world, count, Algorithm::kScatterReduceAllgather, 4, 50, 8192, world == 3, dtype};
        c.segment_bytes = world == 2 ? 400 : 800;
        run_case(c);
      }
    }
  }
}

TEST(Allreduce, PipelineEqualsSequentialPiecesOfTheSameBoundaries) {
  // One piece in pipelined 16 KiB segments (SRA's pipeline; two lanes for the others) must give
  // the same bytes as sequential 16 KiB pieces: same chunks, same buckets, same random streams
  // (segment k of piece 0 uses piece k's). 4 segments, the last short; 3 (one lane retires
  // early) at W = 3. Stochastic rounding for the lanes, so that the streams matter; nearest for
  // SRA, whose pipeline draws its streams per segment of the piece.
  for (auto alg : {Algorithm::kScatterReduceAllgather, Algorithm::kRing, Algorithm::kTree,
                   Algorithm::kAllgather}) {
    for (int world : {2, 3, 4}) {
      testing::Hub hub;
      const int64_t count = world == 3 ? 2 * 4096 + 7 : 3 * 4096 + 100;
      std::vector<std::vector<float>> x = inputs(world, count, 3), y = x;
      for (bool pipelined : {false, true}) {
        auto& data = pipelined ? y : x;
        std::vector<std::thread> threads;
        for (int r = 0; r < world; ++r) {
          threads.emplace_back([&, r] {
            testing::InMemoryTransport t(hub, r, world);
            AllreduceOptions o;
            o.algorithm = alg;
            o.codec.bucket_size = 256;
            o.codec.rounding = alg == Algorithm::kScatterReduceAllgather ? Rounding::kNearest
                                                                         : Rounding::kStochastic;
            o.fusion_bytes = pipelined ? size_t(1) << 20 : size_t(16) << 10;
            o.segment_bytes = pipelined ? size_t(16) << 10 : 0;
            CompressedAllreduce ar;
            ar.run(t, data[size_t(r)].data(), DType::kFloat32, count, o);
          });
        }
        for (auto& t : threads) t.join();
      }
      EXPECT_EQ(x, y) << "algorithm " << int(alg) << " W " << world;
      EXPECT_NE(x, inputs(world, count, 3));
    }
  }
}

TEST(Allreduce, PipelinedLanesWithinTheBound) {
  // Ring and tree in two lanes: many small segments, odd sizes, every dtype, averaging.
  for (auto alg : {Algorithm::kRing, Algorithm::kTree}) {
    for (int world : {2, 3, 5}) {
      for (auto dtype : {DType::kFloat32, DType::kFloat16}) {
        Case c{world, 20011, alg, 4, 50, 1 << 20, world == 3, dtype};
        c.segment_bytes = 2000;
        run_case(c);
      }
    }
  }
}

// The raw tail of the last chunk can need more bytes than chunk 0's payload: 1000 values on 2
// Binomial tree at world sizes that are and are not powers of two (leaves at several depths).
TEST(Allreduce, Tree) {
  for (int world : {2, 3, 5, 7, 8}) {
    for (int64_t count : {1, 100, 4099}) {
      for (int bits : {2, 4, 8}) {
        run_case({world, count, Algorithm::kTree, bits, 32, 1 << 20, false, DType::kFloat32});
      }
    }
  }
}

// ranks at bucket 512 (chunks 512 and 488: the second all raw), 997 on 4 (chunks 256 x 3 and
// 229). Both algorithms, pipelined or not, with odd pieces and segments.
TEST(Allreduce, SkipIncompleteBucketsSendsTheTailRaw) {
  for (auto alg : {Algorithm::kScatterReduceAllgather, Algorithm::kRing, Algorithm::kTree}) {
    for (auto dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (int world : {2, 3, 4}) {
        for (int64_t count : {1, 997, 1000, 20011}) {
          Case c{world, count, alg, 8, 512, 1 << 20, world == 3, dtype};
          c.skip_incomplete = true;
          if (count == 20011) c.segment_bytes = 4096;
          run_case(c);
        }
      }
    }
  }
}

TEST(Allreduce, StochasticRoundingWithinItsBound) {
  for (auto alg : {Algorithm::kScatterReduceAllgather, Algorithm::kRing, Algorithm::kTree}) {
    for (int world : {2, 4}) {
      for (int bits : {1, 2, 4}) {
        Case c{world, 4099, alg, bits, 64, 1 << 20, false, DType::kFloat32};
        c.stochastic = true;
        c.segment_bytes = 2048;
        run_case(c);
      }
    }
  }
}

TEST(Allreduce, UnknownAlgorithmIsRejected) {
  testing::Hub hub;
  testing::InMemoryTransport t(hub, 0, 1);
  std::vector<float> x(100, 1.0f);
  AllreduceOptions o;
  o.algorithm = Algorithm(7);
  CompressedAllreduce ar;
  EXPECT_THROW(ar.run(t, x.data(), DType::kFloat32, 100, o), InvalidArgument);
  EXPECT_THROW((void)algorithm_from_int(-1), InvalidArgument);
  EXPECT_EQ(algorithm_from_int(1), Algorithm::kRing);
  EXPECT_EQ(algorithm_from_int(3), Algorithm::kTree);
  EXPECT_THROW((void)algorithm_from_int(4), InvalidArgument);
}

TEST(Allreduce, SingleRankIsIdentity) {
  run_case({1, 1000, Algorithm::kScatterReduceAllgather, 1, 64, 1 << 20, true, DType::kFloat32});
}

TEST(Allreduce, ChunksCoverThePieceOnBucketBoundaries) {
  for (int64_t count : {0, 1, 511, 512, 513, 100000}) {
    for (int world : {1, 2, 3, 7}) {
      int64_t covered = 0;
      for (int j = 0; j < world; ++j) {
        Range r = chunk_range(count, world, 512, j);
        EXPECT_EQ(r.begin, covered);
        if (r.end < count) {
          EXPECT_EQ(r.end % 512, 0);
        }
        covered = r.end;
      }
      EXPECT_EQ(covered, count);
    }
  }
}

}  // namespace
}  // namespace cgx
