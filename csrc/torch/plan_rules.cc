// The plan's size rules (torch_cgx/plan/auto.py computes them; CGX_COMPRESSOR=auto).
#include <vector>

#include "compressors/registry.h"
#include "core/error.h"
#include "process_group_cgx.h"

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

void ProcessGroupCGX::set_plan(const std::vector<PlanRule>& plan) {
  int64_t last = -1;
  for (const PlanRule& r : plan) {
    CGX_CHECK_ARG(r.max_numel > last, "plan rules must have increasing max_numel, got ",
                  r.max_numel, " after ", last);
    last = r.max_numel;
    CGX_CHECK_ARG(r.segments >= 0 && r.segments <= 4096,
                  "plan rule segments must be in [0, 4096], got ", r.segments);
    validate_config(planned(BackendConfig{}, {r}, 0));
    // An unknown compressor or parameter raises here, not in an allreduce.
    if (!r.compressor.empty() && r.compressor != "maxmin") make_compressor(r.compressor, r.params);
  }
  std::lock_guard<std::mutex> lk(config_mu_);
  plan_ = plan;
  ++settings_version_;
}

std::vector<PlanRule> ProcessGroupCGX::plan() const {
  std::lock_guard<std::mutex> lk(config_mu_);
  return plan_;
}

}  // namespace cgx::binding
