// What one rank of the allreduce fuzz target runs: the first RunSpec::kBytes bytes of an input
// (the rest is what the other ranks send it). Shared by the target and the corpus generator.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_cases.h"

namespace cgx::fuzz {

// What runs over the fuzzed rank's transports: the flat allreduce, or one of the algorithms
// composed around it or beside it (csrc/algorithms: rotated.h, reduce_scatter.h, hierarchical.h).
enum class Structure : uint8_t {
  kAllreduce = 0,
  kRotated = 1,        // blocks of 16 values rotated around the allreduce (fp32)
  kReduceScatter = 2,  // the one-shot reduce-scatter of `world` chunks of `count` values
  kHierarchical = 3,   // `world` nodes of 2 ranks over node and cross-node transports (fp32)
};

struct RunSpec {
  static constexpr size_t kBytes = 5;
  static constexpr int64_t kMaxCount = 2048;

  uint8_t pick = 0;  // byte 0: the case (fuzz_cases.h)
  // Byte 1: bits 0-1 the algorithm, 2-3 the group size (2, 3, 4), 4-5 the dtype, 6 average,
  // 7 this rank is the last one (else rank 0).
  Algorithm algorithm = Algorithm::kScatterReduceAllgather;
  int world = 2;
  bool last_rank = false;
  DType dtype = DType::kFloat32;
  bool average = false;
  // Byte 2: bit 0 error feedback, bit 1 SRA segments of 256 bytes (the comm thread's pipeline),
  // bit 2 pieces of 1 KiB (fusion; hierarchical: slices instead of leaders), bits 3-4 the
  // structure.
  bool feedback = false;
  bool pipelined = false;
  bool small_pieces = false;
  Structure structure = Structure::kAllreduce;
  int64_t count = 0;  // bytes 3-4, modulo kMaxCount

  int rank() const { return last_rank ? world - 1 : 0; }
  // Hierarchical: the fuzzed rank is local rank 0 (a leader) or 1 of node 0.
  int local_rank() const { return last_rank ? 1 : 0; }
  // The honest group's threads (corpus): nodes x 2 ranks for the hierarchical structure.
  int ranks() const { return structure == Structure::kHierarchical ? 2 * world : world; }
  // The fuzzed rank among ranks() (hierarchical ranks are node * 2 + local rank).
  int fuzzed_rank() const { return structure == Structure::kHierarchical ? local_rank() : rank(); }

  static RunSpec parse(const uint8_t* p) {
    RunSpec s;
    s.pick = p[0];
    s.algorithm = Algorithm(p[1] & 3);
    s.world = 2 + ((p[1] >> 2) & 3) % 3;
    s.dtype = DType(((p[1] >> 4) & 3) % kNumDTypes);
    s.average = (p[1] & 64) != 0;
    s.last_rank = (p[1] & 128) != 0;
    s.feedback = (p[2] & 1) != 0;
    s.pipelined = (p[2] & 2) != 0;
    s.small_pieces = (p[2] & 4) != 0;
    s.structure = Structure((p[2] >> 3) & 3);
    s.count = (int64_t(p[3]) | int64_t(p[4]) << 8) % kMaxCount;
    return s;
  }

  void write(uint8_t* p) const {
    p[0] = pick;
    p[1] = uint8_t(int(algorithm) | (world - 2) << 2 | int(dtype) << 4 | average << 6 |
                   last_rank << 7);
    p[2] = uint8_t(feedback | pipelined << 1 | small_pieces << 2 | int(structure) << 3);
    p[3] = uint8_t(count & 0xff);
    p[4] = uint8_t(count >> 8);
  }

  AllreduceOptions options(const Case& c, float* residual) const {
    AllreduceOptions o = c.options();
    o.algorithm = algorithm;
    o.average = average;
    o.residual = residual;
    if (pipelined) o.segment_bytes = 256;
    if (small_pieces) o.fusion_bytes = 1024;
    return o;
  }
};

// The `count` values of `dtype` that rank `rank` reduces: deterministic, a zero, an outlier.
inline std::vector<uint8_t> rank_values(int64_t count, int rank, DType dtype) {
  std::vector<uint8_t> out(size_t(count) * elem_size(dtype));
  for (int64_t i = 0; i < count; ++i) {
    float v = 3.0f * std::sin(0.37f * float(i) + 1.3f * float(rank + 1));
    if (i % 97 == 5) v = 1e4f;
    if (i % 31 == 1) v = 0.0f;
    store_from_float(out.data(), dtype, i, v);
  }
  return out;
}

}  // namespace cgx::fuzz
