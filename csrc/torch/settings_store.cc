#include "settings_store.h"

#include "compressors/registry.h"
#include "core/error.h"
#include "external_compressors.h"

namespace cgx::binding {

SettingsStore::SettingsStore(const BackendConfig& config)
    : config_((validate_config(config), config)) {}

BackendConfig SettingsStore::config() const {
  std::lock_guard<std::mutex> lk(mu_);
  return config_;
}

void SettingsStore::set_config(const BackendConfig& config) {
  validate_config(config);
  std::lock_guard<std::mutex> lk(mu_);
  config_ = config;
  ++version_;
}

void SettingsStore::set_plan(const std::vector<PlanRule>& plan) {
  int64_t last = -1;
  for (const PlanRule& r : plan) {
    CGX_CHECK_ARG(r.max_numel > last, "plan rules must have increasing max_numel, got ",
                  r.max_numel, " after ", last);
    last = r.max_numel;
    CGX_CHECK_ARG(r.segments >= 0 && r.segments <= 4096,
                  "plan rule segments must be in [0, 4096], got ", r.segments);
    validate_config(planned(BackendConfig{}, {r}, 0));
    // An unknown compressor or parameter raises here, not in an allreduce.
    if (!r.compressor.empty() && !uses_codec(r.compressor) && !is_external_compressor(r.compressor))
      make_compressor(r.compressor, r.params);
  }
  std::lock_guard<std::mutex> lk(mu_);
  plan_ = plan;
  ++version_;
}

std::vector<PlanRule> SettingsStore::plan() const {
  std::lock_guard<std::mutex> lk(mu_);
  return plan_;
}

BackendConfig SettingsStore::call_config(int64_t numel) {
  std::lock_guard<std::mutex> lk(mu_);
  if (config_.settings_per_call && call_settings_.refresh(config_)) ++version_;
  return numel < 0 ? config_ : planned(config_, plan_, numel);
}

}  // namespace cgx::binding
