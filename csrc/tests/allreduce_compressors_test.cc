// The allreduce algorithms with every registered compressor (ranks as threads): replicas are
// bit-identical whatever the compressor and algorithm, and the allgather path sums exactly what
// was sent.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "algorithms/allreduce.h"
#include "compressors/registry.h"
#include "in_memory_transport.h"

namespace cgx {
namespace {

std::vector<std::vector<float>> run(const Compressor& c, Algorithm alg, int world, int64_t n,
                                    size_t fusion = size_t(1) << 20, size_t segment = 0) {
  std::vector<std::vector<float>> x(static_cast<size_t>(world));
  std::mt19937 gen(uint32_t(n + world));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x) {
    v.resize(static_cast<size_t>(n));
    for (auto& e : v) e = d(gen);
  }
  testing::Hub hub;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      testing::InMemoryTransport t(hub, r, world);
      AllreduceOptions o;
      o.compressor = &c;
      o.algorithm = alg;
      o.fusion_bytes = fusion;
      o.segment_bytes = segment;
      o.codec.seed = 3;
      CompressedAllreduce ar;
      ar.run(t, x[size_t(r)].data(), DType::kFloat32, n, o);
    });
  }
  for (auto& t : threads) t.join();
  return x;
}

TEST(AllreduceCompressors, EveryCompressorAndAlgorithmGivesIdenticalReplicas) {
  for (const std::string& name : compressor_names()) {
    auto c = make_compressor(name);
    for (auto alg : {Algorithm::kScatterReduceAllgather, Algorithm::kRing, Algorithm::kAllgather}) {
      for (int world : {2, 3}) {
        for (int64_t n : {1, 1000, 4099}) {
          auto x = run(*c, alg, world, n, 8192, 2048);  // several pieces and segments
          for (int r = 1; r < world; ++r) {
            ASSERT_EQ(x[size_t(r)], x[0]) << name << " alg " << int(alg) << " W " << world;
          }
        }
      }
    }
  }
}

TEST(AllreduceCompressors, AllgatherSumsExactlyWhatWasSent) {
  // fp16 through the allgather path: the sum, in rank order in fp32, of the fp16-rounded inputs.
  auto c = make_compressor("fp16");
  const int world = 3;
  const int64_t n = 5000;
  std::vector<std::vector<float>> x(world);
  std::mt19937 gen(uint32_t(n + world));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x) {
    v.resize(size_t(n));
    for (auto& e : v) e = d(gen);
  }
  std::vector<float> want(size_t(n), 0.0f);
  for (int r = 0; r < world; ++r) {
    for (int64_t i = 0; i < n; ++i)
      want[size_t(i)] += half_to_float(float_to_half(x[size_t(r)][size_t(i)]));
  }
  auto got = run(*c, Algorithm::kAllgather, world, n);
  EXPECT_EQ(got[0], want);
}

}  // namespace
}  // namespace cgx
