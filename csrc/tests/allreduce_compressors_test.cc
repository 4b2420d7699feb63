// The allreduce algorithms with every registered compressor (ranks as threads): replicas are
// bit-identical whatever the compressor and algorithm and equal, bit for bit, the composition
// of the compressor's own round trips that docs/algorithms.md describes (replayed here), the
// residuals add up to what the result lost, and the allgather path sums exactly what was sent.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "algorithms/allreduce.h"
#include "algorithms/payload.h"
#include "compressors/registry.h"
#include "core/primitives.h"
#include "in_memory_transport.h"

namespace cgx {
namespace {

// Normal(0, 1) inputs of `world` ranks, n values each.
std::vector<std::vector<float>> normal_inputs(int world, int64_t n, uint32_t seed) {
  std::vector<std::vector<float>> x(static_cast<size_t>(world));
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x) {
    v.resize(static_cast<size_t>(n));
    for (auto& e : v) e = d(gen);
  }
  return x;
}

// Every rank (a thread over an in-memory hub) runs the allreduce of x[rank] in place with
// options(rank); check(rank, ar) runs after that rank's call.
template <typename Options, typename Check>
void on_ranks(std::vector<std::vector<float>>& x, int64_t n, Options options, Check check) {
  const int world = int(x.size());
  testing::Hub hub;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      testing::InMemoryTransport t(hub, r, world);
      CompressedAllreduce ar;
      ar.run(t, x[size_t(r)].data(), DType::kFloat32, n, options(r));
      check(r, ar);
    });
  }
  for (auto& t : threads) t.join();
}

template <typename Options>
void on_ranks(std::vector<std::vector<float>>& x, int64_t n, Options options) {
  on_ranks(x, n, options, [](int, const CompressedAllreduce&) {});
}

AllreduceOptions options_for(const Compressor& c, Algorithm alg, size_t fusion, size_t segment) {
  AllreduceOptions o;
  o.compressor = &c;
  o.algorithm = alg;
  o.fusion_bytes = fusion;
  o.segment_bytes = segment;
  o.codec.seed = 3;
  return o;
}

std::vector<std::vector<float>> run(const Compressor& c, Algorithm alg, int world, int64_t n,
                                    size_t fusion = size_t(1) << 20, size_t segment = 0) {
  auto x = normal_inputs(world, n, uint32_t(n + world));
  on_ranks(x, n, [&](int) { return options_for(c, alg, fusion, segment); });
  return x;
}

// acc[0, m) += decode(encode(v[0, m))), encoded with the streams of (piece, rank, chunk, phase).
void add_round_trip(const AllreduceOptions& o, const float* v, int64_t m, uint64_t piece, int rank,
                    int chunk, int phase, float* acc) {
  std::vector<uint8_t> p(payload_size(o, m, DType::kFloat32));
  const size_t size = encode_payload(o, v, DType::kFloat32, m,
                                     streams_for(o, piece, rank, chunk, phase), p.data(), p.size());
  decode_payload(o, p.data(), size, acc, DType::kFloat32, m, true);
}

// One message (m values at x[r] on rank r, streams of `piece`) as docs/algorithms.md reduces it
// (SUM, fp32): which rank compresses what, with which streams, summed in which order.
void replay_message(const AllreduceOptions& o, const std::vector<const float*>& x, int64_t m,
                    uint64_t piece, float* out) {
  const int world = int(x.size());
  const int64_t align = chunk_alignment(o);
  auto values = [&](int r, Range c) { return std::vector<float>(x[r] + c.begin, x[r] + c.end); };
  auto finish = [&](const std::vector<float>& sum, Range c, int rank, int chunk) {
    std::fill(out + c.begin, out + c.end, 0.0f);
    add_round_trip(o, sum.data(), c.size(), piece, rank, chunk, 2, out + c.begin);
  };
  if (o.algorithm == Algorithm::kAllgather || gather_only(o) || sum_in_transit(o)) {
    std::fill(out, out + m, 0.0f);  // each rank's values compressed once, summed in rank order
    for (int r = 0; r < world; ++r) add_round_trip(o, x[r], m, piece, r, 0, 0, out);
  } else if (o.algorithm == Algorithm::kTree) {  // partial sums up a binomial tree
    std::vector<std::vector<float>> sum(static_cast<size_t>(world));
    for (int r = world - 1; r >= 0; --r) {
      sum[r] = values(r, {0, m});
      for (int mask = 1; mask < (r ? r & -r : world) && r + mask < world; mask <<= 1) {
        add_round_trip(o, sum[r + mask].data(), m, piece, r + mask, 0, 1, sum[r].data());
      }
    }
    finish(sum[0], {0, m}, 0, 0);
  } else {
    for (int j = 0; j < world; ++j) {
      const Range c = chunk_range(m, world, align, j);
      std::vector<float> sum = values(j, c);
      if (o.algorithm == Algorithm::kRing) {  // rank j + t adds its values, compresses the sum
        for (int t = 0; t + 1 < world; ++t) {
          std::vector<float> next = values((j + t + 1) % world, c);
          add_round_trip(o, sum.data(), c.size(), piece, (j + t) % world, j, t ? 1 : 0,
                         next.data());
          sum = std::move(next);
        }
        finish(sum, c, (j + world - 1) % world, j);
      } else {  // SRA: the owner j adds the others' compressed chunks to its own values
        for (int q = 0; q < world; ++q) {
          if (q != j) add_round_trip(o, x[q] + c.begin, c.size(), piece, q, j, 0, sum.data());
        }
        finish(sum, c, j, j);
      }
    }
  }
}

// The result of the allreduce (SUM) of x with options o: pieces of o.fusion_bytes, cut into
// segments (streams of piece * 1000003 + k) by SRA's pipeline, and by the other algorithms'
// lanes where a piece is longer than a segment (sparse paths only with pipeline_sparse).
std::vector<float> replay(const AllreduceOptions& o, const std::vector<std::vector<float>>& x) {
  const int64_t n = int64_t(x[0].size()), piece_elems = int64_t(o.fusion_bytes / 4);
  const bool sparse = gather_only(o) || sum_in_transit(o);
  const bool sra = !sparse && o.algorithm == Algorithm::kScatterReduceAllgather;
  std::vector<float> out(static_cast<size_t>(n));
  uint64_t piece = 0;
  for (int64_t begin = 0; begin < n; begin += piece_elems, ++piece) {
    const int64_t count = std::min(piece_elems, n - begin);
    const bool lanes = o.segment_bytes > 0 && size_t(count) * 4 > o.segment_bytes &&
                       (sparse ? o.pipeline_sparse : !sra);
    int64_t seg = count;
    if (o.segment_bytes > 0 && (sra || lanes)) {
      const int64_t align = chunk_alignment(o);
      seg = std::max<int64_t>(1, int64_t(o.segment_bytes / 4) / align) * align;
    }
    for (int64_t k = 0; k * seg < count; ++k) {
      const int64_t at = begin + k * seg;
      std::vector<const float*> parts;
      for (const auto& v : x) parts.push_back(v.data() + at);
      replay_message(o, parts, std::min(seg, count - k * seg),
                     sra || lanes ? piece * 1000003u + uint64_t(k) : piece, out.data() + at);
    }
  }
  return out;
}

TEST(AllreduceCompressors, EveryCompressorAndAlgorithmGivesIdenticalReplicasOfTheReplay) {
  for (const std::string& name : compressor_names()) {
    auto c = make_compressor(name);
    for (auto alg : {Algorithm::kScatterReduceAllgather, Algorithm::kRing, Algorithm::kAllgather,
                     Algorithm::kTree}) {
      for (int world : {2, 3}) {
        for (int64_t n : {1, 1000, 4099}) {
          auto x = run(*c, alg, world, n, 8192, 2048);  // several pieces and segments
          for (int r = 1; r < world; ++r) {
            ASSERT_EQ(x[size_t(r)], x[0]) << name << " alg " << int(alg) << " W " << world;
          }
          const auto want = replay(options_for(*c, alg, 8192, 2048),
                                   normal_inputs(world, n, uint32_t(n + world)));
          ASSERT_EQ(x[0], want) << name << " alg " << int(alg) << " W " << world << " n " << n;
        }
      }
    }
  }
}

// The registered max-min is the codec itself (its codec() trait), so the algorithms give the
// same bits with it as with a null compressor and the same parameters in `codec`; no other
// compressor claims the trait.
TEST(AllreduceCompressors, MaxMinCompressorIsTheCodecPath) {
  for (const std::string& name : compressor_names()) {
    EXPECT_EQ(make_compressor(name)->codec() != nullptr, name == "maxmin") << name;
  }
  auto c = make_compressor("maxmin", {{"bits", 3},
                                      {"bucket_size", 64},
                                      {"skip_incomplete_buckets", 1},
                                      {"stochastic", 1},
                                      {"clip", 1}});
  const CodecParams& p = *c->codec();
  EXPECT_EQ(p.bits, 3);
  EXPECT_EQ(p.bucket_size, 64);
  EXPECT_TRUE(p.skip_incomplete_buckets && p.clip && p.rounding == Rounding::kStochastic);
  for (auto alg : {Algorithm::kScatterReduceAllgather, Algorithm::kRing, Algorithm::kAllgather,
                   Algorithm::kTree}) {
    const int world = 3;
    const int64_t n = 4099;
    auto with = run(*c, alg, world, n, 8192, 2048);
    auto without = normal_inputs(world, n, uint32_t(n + world));
    on_ranks(without, n, [&](int) {
      AllreduceOptions o;
      o.codec = p;
      o.codec.seed = 3;
      o.algorithm = alg;
      o.fusion_bytes = 8192;
      o.segment_bytes = 2048;
      return o;
    });
    EXPECT_EQ(with, without) << "alg " << int(alg);
  }
}

TEST(AllreduceCompressors, AllgatherSumsExactlyWhatWasSent) {
  // fp16 through the allgather path: the sum, in rank order in fp32, of the fp16-rounded inputs.
  auto c = make_compressor("fp16");
  const int world = 3;
  const int64_t n = 5000;
  const auto x = normal_inputs(world, n, uint32_t(n + world));
  std::vector<float> want(size_t(n), 0.0f);
  for (int r = 0; r < world; ++r) {
    for (int64_t i = 0; i < n; ++i)
      want[size_t(i)] += half_to_float(float_to_half(x[size_t(r)][size_t(i)]));
  }
  auto got = run(*c, Algorithm::kAllgather, world, n);
  EXPECT_EQ(got[0], want);
}

// Sparse paths pipeline only when asked for (pipeline_sparse): with it, a piece in segments
// gives the bytes of sequential pieces of the segments' size (same selection, same streams);
// without it, a segment size alone changes nothing.
TEST(AllreduceCompressors, SparsePathsPipelineOnlyWhenAsked) {
  for (const char* name : {"topk", "randomk", "dgc"}) {
    auto c = make_compressor(name);
    for (int world : {2, 3}) {
      const int64_t n = 5 * 1024 + 33;
      auto base = [&](int) {
        AllreduceOptions o;
        o.compressor = c.get();
        o.codec.seed = 3;
        return o;
      };
      auto whole = normal_inputs(world, n, 21), seq = whole, lanes = whole, ignored = whole;
      on_ranks(whole, n, [&](int r) { return base(r); });
      on_ranks(seq, n, [&](int r) {
        AllreduceOptions o = base(r);
        o.fusion_bytes = 4096;
        return o;
      });
      on_ranks(lanes, n, [&](int r) {
        AllreduceOptions o = base(r);
        o.segment_bytes = 4096;
        o.pipeline_sparse = true;
        return o;
      });
      on_ranks(ignored, n, [&](int r) {
        AllreduceOptions o = base(r);
        o.segment_bytes = 4096;
        return o;
      });
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(lanes[size_t(r)], seq[size_t(r)]) << name << " W " << world << " rank " << r;
        ASSERT_EQ(ignored[size_t(r)], whole[size_t(r)]) << name << " W " << world;
      }
      ASSERT_NE(seq[0], whole[0]) << name;  // the segments' selection differs from the whole's
    }
  }
}

// random-k sums in transit: at the indices every rank drew from the shared stream, the fp32 sum
// of the ranks' values in rank order; 0 elsewhere. The residual is what each rank did not send.
TEST(AllreduceCompressors, RandomKSumsInTransitExactly) {
  auto c = make_compressor("randomk", {{"ratio", 0.05}});
  const int world = 3;
  const int64_t n = 4099;
  auto x = normal_inputs(world, n, 9);
  std::vector<std::vector<float>> res(world, std::vector<float>(size_t(n)));
  const auto x0 = x;
  AllreduceOptions o;
  o.compressor = c.get();
  o.codec.seed = 3;
  auto options = [&](int r) {
    AllreduceOptions mine = o;
    mine.residual = res[size_t(r)].data();
    return mine;
  };
  on_ranks(x, n, options, [&](int r, const CompressedAllreduce& ar) {
    if (r == 0) {
      EXPECT_LT(ar.bytes_sent(), size_t(n));  // 205 values: far below n * 4 / 2
    }
  });
  const auto idx = prim::random_k(n, 205, rng_key(3, streams_for(o, 0, 0, 0, 0).shared));
  std::vector<float> want(size_t(n), 0.0f);
  for (uint32_t i : idx) {
    float sum = 0.0f;
    for (int r = 0; r < world; ++r) sum += x0[size_t(r)][i];
    want[i] = sum;
  }
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(x[size_t(r)], want) << "rank " << r;
    std::vector<float> left = x0[size_t(r)];
    for (uint32_t i : idx) left[i] = 0.0f;
    ASSERT_EQ(res[size_t(r)], left) << "rank " << r;
  }
}

// Error feedback: each rank learns x - decode(encode(x)) of what it sent of its own values, and
// the owner what the final compression of its chunk's sum left out. signsgd decodes x to
// sign(x): SRA sends every chunk but the owner's, ring the rank's own chunk on its first hop,
// allgather-reduce the whole piece.
TEST(AllreduceCompressors, ResidualIsWhatTheRankDidNotSend) {
  auto c = make_compressor("signsgd");
  const int world = 3;
  const int64_t n = 1001;
  for (auto alg : {Algorithm::kScatterReduceAllgather, Algorithm::kRing, Algorithm::kAllgather}) {
    auto x = normal_inputs(world, n, 5);
    std::vector<std::vector<float>> res(world, std::vector<float>(size_t(n), 7.0f));
    const auto x0 = x;
    on_ranks(x, n, [&](int r) {
      AllreduceOptions o;
      o.compressor = c.get();
      o.algorithm = alg;
      o.segment_bytes = 400;  // pipelined: segments of 100 values (SRA's pipeline, ring's lanes)
      o.residual = res[size_t(r)].data();
      return o;
    });
    for (int r = 0; r < world; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        const float v = x0[size_t(r)][size_t(i)];
        bool sent = true;
        if (alg != Algorithm::kAllgather) {
          // Which chunk holds i: segments of 100 values, chunks within each.
          const int64_t seg = 100;
          const int64_t b = i / seg * seg, m = std::min(seg, n - b);
          int owner = 0;
          for (int j = 0; j < world; ++j) {
            const Range ch = chunk_range(m, world, 1, j);
            if (i - b >= ch.begin && i - b < ch.end) owner = j;
          }
          sent = alg == Algorithm::kRing ? owner == r : owner != r;
        }
        float want = sent ? v - (v < 0 ? -1.0f : 1.0f) : 0.0f;
        if (alg == Algorithm::kScatterReduceAllgather && !sent) {
          // The owner: its own value plus the others' signs, then the sign of that sum.
          float sum = v;
          for (int q = 0; q < world; ++q) {
            if (q != r) sum += x0[size_t(q)][size_t(i)] < 0 ? -1.0f : 1.0f;
          }
          want = sum - (sum < 0 ? -1.0f : 1.0f);
        }
        if (alg == Algorithm::kRing && !sent) continue;  // intermediate sums: not checked here
        ASSERT_EQ(res[size_t(r)][size_t(i)], want) << "alg " << int(alg) << " rank " << r;
      }
    }
  }
}

// Complete error feedback: over the ranks, the residuals add up to what the allreduce lost,
// sum_r x_r - result, for every compressor and algorithm (ring: its intermediate
// re-compressions included).
TEST(AllreduceCompressors, ResidualsAddUpToTheLoss) {
  for (const std::string& name : compressor_names()) {
    auto c = make_compressor(name);
    for (auto alg : {Algorithm::kScatterReduceAllgather, Algorithm::kRing, Algorithm::kAllgather,
                     Algorithm::kTree}) {
      const int world = 5;
      const int64_t n = 3001;
      auto x = normal_inputs(world, n, 13);
      std::vector<std::vector<float>> res(world, std::vector<float>(size_t(n)));
      const auto x0 = x;
      on_ranks(x, n, [&](int r) {
        AllreduceOptions o;
        o.compressor = c.get();
        o.algorithm = alg;
        o.residual = res[size_t(r)].data();
        return o;
      });
      double worst = 0, lost_norm = 0;
      for (int64_t i = 0; i < n; ++i) {
        double exact = 0, fed_back = 0;
        for (int r = 0; r < world; ++r) {
          exact += x0[size_t(r)][size_t(i)];
          fed_back += res[size_t(r)][size_t(i)];
        }
        const double lost = exact - x[0][size_t(i)];
        worst = std::max(worst, std::fabs(lost - fed_back));
        lost_norm = std::max(lost_norm, std::fabs(lost));
      }
      // fp32 roundings of sums of W values of magnitude <= ~W * 5: below what was lost (fp16's
      // 2^-11 of the sums, the least, is some 1e-3)
      EXPECT_LT(worst, 1e-4) << name << " alg " << int(alg);
      EXPECT_GT(lost_norm, 1e-3) << name << " alg " << int(alg);  // the test is not vacuous
    }
  }
}

}  // namespace
}  // namespace cgx
