// Generated from the settings table (torch_cgx/settings.py) by scripts/settings_rules.py
// (`make settings-doc`); do not edit: tests/test_settings_rules.py fails when it differs from
// what the table makes. Each native setting's field, variable and default, in native units,
// and each integer range with its message. Torch-free.
#pragma once

#include <cstdint>

namespace cgx::binding::rules {

template <typename T>
struct Setting {
  const char* name;  // the BackendConfig field, as native messages name it
  const char* env;   // its CGX_* variable
  T def;
};

// [lo, hi], or `also` (lo where there is none); `text` is how the messages state it.
struct Range {
  int64_t lo, hi, also;
  const char* text;
  constexpr bool ok(int64_t v) const { return (v >= lo && v <= hi) || v == also; }
};

// One declaration a line, as generated.
// clang-format off
// bits (call)
inline constexpr Setting<int64_t> kBits{"bits", "CGX_COMPRESSION_QUANTIZATION_BITS", 32};
inline constexpr Range kBitsRange{1, 8, 32, "must be 1..8, or 32 for no compression"};
// bucket_size (call)
inline constexpr Setting<int64_t> kBucketSize{"bucket_size", "CGX_COMPRESSION_BUCKET_SIZE", 512};
inline constexpr Range kBucketSizeRange{1, 4294967295, 1, "must be an integer in [1, 2^32)"};
// skip_incomplete_buckets (call)
inline constexpr Setting<bool> kSkipIncompleteBuckets{"skip_incomplete_buckets", "CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS", false};
// min_size (group)
inline constexpr Setting<int64_t> kMinSize{"minimal_size", "CGX_COMPRESSION_MINIMAL_SIZE", 16};
inline constexpr Range kMinSizeRange{0, 4611686018427387904, 0, "must be an integer in [0, 4611686018427387904]"};
// fusion_buffer_mb (group)
inline constexpr Setting<int64_t> kFusionBufferMb{"fusion_buffer_bytes", "CGX_FUSION_BUFFER_SIZE_MB", 67108864};
inline constexpr Range kFusionBufferMbRange{1048576, 1099511627776, 1048576, "must be an integer in [1, 1048576]"};
// algorithm (group)
inline constexpr Setting<int64_t> kAlgorithm{"algorithm", "CGX_REDUCTION_ALGORITHM", 0};
// pipeline_segment_mb (group)
inline constexpr Setting<int64_t> kPipelineSegmentMb{"pipeline_segment_bytes", "CGX_PIPELINE_SEGMENT_MB", 4194304};
inline constexpr Range kPipelineSegmentMbRange{0, 1099511627776, 0, "must be an integer in [0, 1048576]"};
// stochastic (group)
inline constexpr Setting<bool> kStochastic{"stochastic", "CGX_COMPRESSION_STOCHASTIC", false};
// rotation (group)
inline constexpr Setting<const char*> kRotation{"rotation", "CGX_COMPRESSION_ROTATION", "off"};
// clip (group)
inline constexpr Setting<const char*> kClip{"clip", "CGX_COMPRESSION_CLIP", "auto"};
// seed (group)
inline constexpr Setting<int64_t> kSeed{"seed", "CGX_COMPRESSION_SEED", 0};
// seed: its range exceeds int64_t; the table's check is the only one
// compressor (group)
inline constexpr Setting<const char*> kCompressor{"compressor", "CGX_COMPRESSOR", "maxmin"};
// settings_per_call (group)
inline constexpr Setting<bool> kSettingsPerCall{"settings_per_call", "CGX_SETTINGS_PER_CALL", true};
// hierarchical (creation)
inline constexpr Setting<const char*> kHierarchical{"hierarchical", "CGX_HIERARCHICAL", "auto"};
// intra_broadcast (creation)
inline constexpr Setting<bool> kIntraBroadcast{"intra_broadcast", "CGX_INTRA_BROADCAST", true};
// inner_communicator (creation)
inline constexpr Setting<const char*> kInnerCommunicator{"inner_communicator", "CGX_INNER_COMMUNICATOR_TYPE", ""};
// cross_communicator (creation)
inline constexpr Setting<const char*> kCrossCommunicator{"cross_communicator", "CGX_CROSS_COMMUNICATOR_TYPE", ""};
// intra_compress (creation)
inline constexpr Setting<const char*> kIntraCompress{"intra_compress", "CGX_INTRA_COMPRESS", "off"};
// data_plane (creation)
inline constexpr Setting<const char*> kDataPlane{"data_plane", "CGX_DATA_PLANE", "auto"};

// The call settings, read again at every allreduce (call_settings.h), in table order.
inline constexpr int kCallSettings = 3;
inline constexpr const char* kCallVars[kCallSettings] = {kBits.env, kBucketSize.env, kSkipIncompleteBuckets.env};
// rotation on needs a bucket_size that is a power of two in [lo, hi].
inline constexpr int64_t kRotationMinBlock = 2;
inline constexpr int64_t kRotationMaxBlock = 1048576;
inline constexpr const char* kRotationBlocksText = "a power of two in [2, 2^20]";
// A min_size below this acts as it.
inline constexpr int64_t kMinSizeFloor = 16;
// clang-format on

}  // namespace cgx::binding::rules
