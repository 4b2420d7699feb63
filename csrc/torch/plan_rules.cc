// The plan's size rules (torch_cgx/plan/auto.py computes them; CGX_COMPRESSOR=auto).
#include <vector>

#include "backend_config.h"

namespace cgx::binding {

BackendConfig planned(const BackendConfig& c, const std::vector<PlanRule>& plan, int64_t numel) {
  for (const PlanRule& r : plan) {
    if (numel > r.max_numel) continue;
    BackendConfig out = c;
    out.planned = true;
    out.compressor = r.compressor.empty() ? kAutoCompressor : r.compressor;
    out.compressor_params = r.params;
    out.bits = r.compressor.empty() ? 32 : r.bits;
    out.bucket_size = r.bucket_size;
    out.algorithm = r.algorithm;
    // Segments are planned for fp32 values (4 bytes): a segment is (4 numel) / segments bytes;
    // 0 keeps the group's own segment size.
    if (r.segments == 1) out.pipeline_segment_bytes = 0;
    if (r.segments > 1) out.pipeline_segment_bytes = (4 * numel + r.segments - 1) / r.segments;
    out.pipeline_sparse = r.segments > 1;
    return out;
  }
  return c;
}

}  // namespace cgx::binding
