// How a call's settings become the algorithms' options, shared by the allreduce
// (process_group_cgx.cc) and the reduce-scatter (reduce_scatter.cc).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "algorithms/allreduce.h"
#include "process_group_cgx.h"

namespace cgx::binding {

// The one place of the rotation / clip rule (the hooks ask it through _C.rotation_rule and
// _C.clip_rule). Rotation applies to max-min only: "on" with a bucket size that is a power of two
// in [2, 2^20] (validate_config rejects "on" otherwise), "auto" there too at 1-4 bits, where
// rotating measured a lower error (docs/accuracy.md section 4). The clipped range ("auto")
// follows the rotation: it is optimal for the near-Gaussian values a rotation makes.
bool rotation_rule(const std::string& rotation, int bits, int64_t bucket_size,
                   const std::string& compressor);
bool clip_rule(const std::string& clip, bool rotates);

// The parameters `c`'s compressor is built with: for the max-min codec, the fields bits,
// bucket_size, skip_incomplete_buckets, stochastic and the clip rule's result; for any other
// compressor, c.compressor_params.
std::map<std::string, double> compressor_params_of(const BackendConfig& c);
// The registered compressor of `c` with those parameters (max-min needs bits in 1..8).
std::unique_ptr<Compressor> make_call_compressor(const BackendConfig& c);

// A call's settings, validated and resolved once (a hook builds one per group-settings version
// and reuses it for every gradient bucket). Copies share the compressor; changing the stream
// changes nothing else and validates nothing.
class CallOptions {
 public:
  // Throws InvalidArgument (ValueError) naming the first bad field, as validate_config does.
  explicit CallOptions(const BackendConfig& config);

  const BackendConfig& config() const { return config_; }
  // Whether the call compresses at all (max-min at 1..8 bits, or another compressor); a tensor
  // below minimal_size, or not floating, is still reduced exactly.
  bool compressed() const { return compressed_; }
  bool rotates() const { return rotates_; }
  bool clips() const { return clips_; }
  // >= 0: the call's random-stream index; -1: the group's call counter (BackendConfig::stream).
  int64_t stream() const { return config_.stream; }
  void set_stream(int64_t stream);
  // The call's compressor (max-min too), built once; null when the call does not compress or
  // its compressor is "auto" (the plan's rule decides per call).
  const Compressor* compressor() const { return compressor_.get(); }
  const std::shared_ptr<const Compressor>& shared_compressor() const { return compressor_; }

 private:
  BackendConfig config_;
  bool compressed_ = false;
  bool rotates_ = false;
  bool clips_ = false;
  std::shared_ptr<const Compressor> compressor_;
};

// Whether some bits setting would compress t (minimal_size is agreed at creation; bits may
// change per call).
bool eligible(const at::Tensor& t, const BackendConfig& c);
// Whether c compresses t now.
bool compressible(const at::Tensor& t, const BackendConfig& c);
AllreduceOptions to_options(const BackendConfig& c, bool average, uint64_t call_index);
// The same from resolved options: their clip rule and their compressor.
AllreduceOptions to_options(const CallOptions& c, bool average, uint64_t call_index);
// validate_config without building the compressor (CallOptions builds it once itself).
void validate_fields(const BackendConfig& c);

// The buffer a reduction works on in fp32: t itself, flattened, when it is contiguous fp32 on
// the CPU (the result replaces it anyway), else an fp32 copy; finish() writes a copy back to t.
struct Fp32Work {
  at::Tensor flat;
  bool in_place = false;
  void finish(at::Tensor& t) const {
    if (!in_place) t.copy_(flat.view(t.sizes()));
  }
};
Fp32Work fp32_work(const at::Tensor& t);

}  // namespace cgx::binding
