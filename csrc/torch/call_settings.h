// CGX's per-call settings: CGX_COMPRESSION_QUANTIZATION_BITS, CGX_COMPRESSION_BUCKET_SIZE and
// CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS are read again at every allreduce, as CGX does, so that
// a script may change them with os.environ[...] = ... between calls. A variable that changed
// since the group last read it (set, changed or unset: then its default) replaces the group's
// value, whatever set_config set; set_config's values stay until a variable changes again.
// Because each rank reads its own environment, every allreduce that could be compressed first
// agrees on the three values (a 16-byte allgather): ranks that differ all raise ValueError.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "algorithms/transport.h"
#include "settings_rules.h"

namespace cgx::binding {

struct BackendConfig;

// The one parser of the CGX_* integer and boolean values (torch_cgx/config.py calls these too):
// decimal integers below 2^63 in magnitude (sign allowed, surrounding blanks ignored); booleans
// 1/0, true/false, yes/no, on/off. ValueError naming the variable otherwise.
int64_t parse_env_int(const std::string& var, const std::string& raw);
bool parse_env_bool(const std::string& var, const std::string& raw);

class CallSettings {
 public:
  // Records the variables' current values: those the group was created with.
  CallSettings();
  // Applies the variables that changed since the last call to `config`; returns whether any
  // did. A malformed value raises ValueError naming it, and nothing changes.
  bool refresh(BackendConfig& config);

 private:
  std::array<std::optional<std::string>, rules::kCallSettings> seen_;
};

// Every rank's (bits, bucket_size, skip_incomplete_buckets) through t's allgather; ValueError on
// every rank, naming each variable whose values differ and every rank's value, when they do.
void agree_call_settings(Transport& t, const BackendConfig& c);

}  // namespace cgx::binding
