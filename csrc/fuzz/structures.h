// One rank of what a RunSpec asks for (allreduce_spec.h), over the transports it is given: the
// fuzz target's FuzzWire, or the corpus generator's honest Recorders. Shared by both so that
// the bytes recorded are the bytes the target takes, in the same order.
#pragma once

#include <algorithm>
#include <vector>

#include "algorithms/hierarchical.h"
#include "algorithms/payload.h"
#include "algorithms/reduce_scatter.h"
#include "algorithms/rotated.h"
#include "fuzz/allreduce_spec.h"

namespace cgx::fuzz {

// Rank `rank` of s.ranks(): `group` is its transport (hierarchical: the node's, of 2 ranks) and
// `cross` the cross-node one (hierarchical only; null on a non-leader with leaders).
inline void run_rank(const RunSpec& s, const Case& c, int rank, Transport& group,
                     Transport* cross) {
  const bool fp32_only =
      s.structure == Structure::kRotated || s.structure == Structure::kHierarchical;
  const DType dtype = fp32_only ? DType::kFloat32 : s.dtype;
  const int64_t chunks = s.structure == Structure::kReduceScatter ? s.world : 1;
  std::vector<uint8_t> x = rank_values(s.count * chunks, rank, dtype);
  std::vector<float> residual(s.feedback ? size_t(s.count) : 0);
  float* res = s.feedback ? residual.data() : nullptr;
  AllreduceOptions o = s.options(c, res);
  CompressedAllreduce allreduce;
  auto* values = reinterpret_cast<float*>(x.data());
  switch (s.structure) {
    case Structure::kAllreduce:
      allreduce.run(group, x.data(), dtype, s.count, o);
      return;
    case Structure::kRotated:
      with_rotation(values, s.count, 16, rotation_seed(7, 0), res,
                    [&](float* data, int64_t n, float* r) {
                      o.residual = r;
                      allreduce.run(group, data, DType::kFloat32, n, o);
                    });
      return;
    case Structure::kReduceScatter: {
      std::vector<float> out(static_cast<size_t>(s.count));
      CompressedReduceScatter().run(group, x.data(), dtype, s.count, o, out.data());
      return;
    }
    case Structure::kHierarchical: {
      uint64_t calls = 0;
      const CrossAllreduce across = [&](Transport& t, float* data, int64_t n, float* r) {
        AllreduceOptions co = o;
        co.average = false;
        co.call_index = calls++;
        co.residual = r;
        allreduce.run(t, data, DType::kFloat32, n, co);
        return allreduce.bytes_sent();
      };
      HierarchicalOptions h;
      h.local_rank = rank % 2;
      h.local_size = 2;
      h.intra_broadcast = !s.small_pieces;
      // The backend aligns slices to the compressor's bucket; at most 256 here, so that a
      // 4096-value bucket's slices (2 x 16 KiB of exact node sums) still fit an input.
      h.alignment = std::min<int64_t>(chunk_alignment(o), 256);
      h.divisor = s.average ? float(2 * s.world) : 0.0f;
      h.residual = res;
      hierarchical_allreduce(NodeGroups{&group, cross, nullptr, nullptr}, h, values, s.count,
                             across);
      return;
    }
  }
}

}  // namespace cgx::fuzz
