// A group's settings: the persistent BackendConfig, the plan's size rules (CGX_COMPRESSOR=auto),
// the per-call environment variables (call_settings.h) and a version that moves whenever any of
// them changes. Every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "backend_config.h"
#include "call_settings.h"

namespace cgx::binding {

class SettingsStore {
 public:
  // Throws InvalidArgument (ValueError) naming the first bad field.
  explicit SettingsStore(const BackendConfig& config);

  BackendConfig config() const;
  void set_config(const BackendConfig& config);
  // Ascending max_numel; empty: the group's settings alone. Validated whole before it applies.
  void set_plan(const std::vector<PlanRule>& plan);
  std::vector<PlanRule> plan() const;
  // The settings of a call of `numel` values issued now: the per-call variables read again when
  // the group reads them per call, then the plan's rule (numel < 0: no plan).
  BackendConfig call_config(int64_t numel = -1);
  // Moves with set_config, set_plan and a changed per-call variable.
  int64_t version() const { return version_; }
  // 1, 2, ...: numbers the settings agreements of the group (keys in its store).
  int64_t next_agreement() { return ++agreements_; }

 private:
  mutable std::mutex mu_;
  BackendConfig config_;        // with mu_ held
  std::vector<PlanRule> plan_;  // with mu_ held
  CallSettings call_settings_;  // with mu_ held
  std::atomic<int64_t> version_{0};
  std::atomic<int64_t> agreements_{0};
};

}  // namespace cgx::binding
