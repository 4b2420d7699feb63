// A group's settings as the native side holds them (torch_cgx/settings.py declares each once and
// copies them here; the defaults come from its generated settings_rules.h), and the plan's size
// rules. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "settings_rules.h"

namespace cgx::binding {

// Documented with its CGX_* variables in torch_cgx/settings.py, validated there (messages naming
// the variables) and again here (validate_config, with the table's ranges: settings_rules.h) for
// values set from Python directly.
struct BackendConfig {
  int bits = int(rules::kBits.def);  // 32: no compression
  int64_t bucket_size = rules::kBucketSize.def;
  bool skip_incomplete_buckets = rules::kSkipIncompleteBuckets.def;
  int64_t minimal_size = rules::kMinSize.def;  // elements; smaller tensors are reduced exactly
  int64_t fusion_buffer_bytes = rules::kFusionBufferMb.def;
  int64_t pipeline_segment_bytes = rules::kPipelineSegmentMb.def;  // 0: no pipeline
  bool pipeline_sparse = false;  // set by a plan rule with segments > 1 (AllreduceOptions)
  int algorithm = int(rules::kAlgorithm.def);  // cgx::Algorithm
  bool stochastic = rules::kStochastic.def;
  // Seeded rotation of each bucket before max-min (allreduce only): "off" (the default), "auto"
  // (at 1-4 bits when bucket_size is a power of two), "on". See ProcessGroupCGX::reduce_rotated.
  std::string rotation = rules::kRotation.def;
  // Gaussian-optimal range per max-min bucket (CodecParams::clip): "auto" (where the call
  // rotates), "on", "off".
  std::string clip = rules::kClip.def;
  uint64_t seed = uint64_t(rules::kSeed.def);
  // >= 0: the index of this call's random streams, given by a caller that counts its own calls
  // (a DDP hook's state: a resumed run then draws what an uninterrupted one would); -1: the
  // group's call counter.
  int64_t stream = -1;
  // A registered compressor (csrc/compressors/list.h); "maxmin" takes bits, bucket_size,
  // skip_incomplete_buckets and stochastic above, the others their own parameters.
  std::string compressor = rules::kCompressor.def;
  std::map<std::string, double> compressor_params;
  // Read CGX_COMPRESSION_{QUANTIZATION_BITS,BUCKET_SIZE,SKIP_INCOMPLETE_BUCKETS} again at every
  // allreduce (call_settings.h); false: once, at group creation.
  bool settings_per_call = rules::kSettingsPerCall.def;
  // Node-aware allreduce, fixed at group creation (torch_cgx/backend.py builds the Hierarchy):
  // "auto" (on when several nodes have several ranks), "on", "off"; CGX's communicator types
  // are validated and recorded (both levels travel over torch's Gloo).
  std::string hierarchical = rules::kHierarchical.def;
  bool intra_broadcast = rules::kIntraBroadcast.def;
  std::string inner_communicator = rules::kInnerCommunicator.def;
  std::string cross_communicator = rules::kCrossCommunicator.def;
  // "off", "fp16", "bf16": see Hierarchy::intra_compress
  std::string intra_compress = rules::kIntraCompress.def;
  // Where tensors are compressed (torch_cgx/settings.py): "auto" (CUDA tensors on the device
  // plane), "device" (every tensor on the device plane), "host" (the native engine, CUDA tensors
  // through a host copy).
  std::string data_plane = rules::kDataPlane.def;
  // Set by planned(): the plan chose this call's settings, the same on every rank by
  // construction, so no per-call agreement is needed.
  bool planned = false;
};

// Whether max-min at `bits` quantizes: the table's bits range (its other value, 32, is exact).
constexpr bool quantizes(int64_t bits) {
  return bits >= rules::kBitsRange.lo && bits <= rules::kBitsRange.hi;
}

// Throws cgx::InvalidArgument (ValueError in Python) naming the first bad field.
void validate_config(const BackendConfig& c);

// CGX_COMPRESSOR=auto: the plan's rules choose per call; a call no rule covers, or one the plan
// keeps exact, is forwarded to the inner Gloo backend like any other collective.
inline constexpr const char* kAutoCompressor = "auto";

// One line of a plan (torch_cgx.plan, CGX_COMPRESSOR=auto): allreduces of up to `max_numel`
// values (and above the previous rule's) run with these settings; `compressor` empty: exactly.
struct PlanRule {
  int64_t max_numel = 0;
  std::string compressor;  // "" (exact), "maxmin" (bits, bucket_size) or another compressor
  std::map<std::string, double> params;
  int bits = int(rules::kBits.def);
  int64_t bucket_size = rules::kBucketSize.def;
  int algorithm = int(rules::kAlgorithm.def);
  // The pipeline (CaSync): 0 the group's own segment size, 1 none, k > 1: k segments of the
  // call (sparse paths too: AllreduceOptions::pipeline_sparse).
  int64_t segments = 0;
};

// Whether an allreduce with `c` rotates its buckets: rotation_rule (call_options.h) of its fields.
bool rotates(const BackendConfig& c);

// Whether `compressor` names the max-min codec (core/codec.h): a registered compressor whose
// codec() trait is set. Its parameters are BackendConfig's own fields (bits, bucket_size,
// skip_incomplete_buckets, stochastic, clip: compressor_params_of in call_options.h), and the
// algorithms recognise it by the same trait to take the codec's direct path.
bool uses_codec(const std::string& compressor);

// `c` with the plan's rule for an allreduce of `numel` values applied (unchanged without one).
BackendConfig planned(const BackendConfig& c, const std::vector<PlanRule>& plan, int64_t numel);

}  // namespace cgx::binding
