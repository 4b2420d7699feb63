// How a call's settings become the algorithms' options, and the settings' validation.
#include "call_options.h"

#include <algorithm>
#include <set>

#include "compressors/registry.h"
#include "core/error.h"
#include "core/rotation.h"
#include "dtype_map.h"
#include "external_compressors.h"

namespace cgx::binding {

// The table's rotation blocks are the rotation's (torch_cgx/settings.py, ROTATION_BLOCKS).
static_assert(rules::kRotationMinBlock == rotation::kMinBlock &&
              rules::kRotationMaxBlock == rotation::kMaxBlock);

// Whether some bits setting would compress t (minimal_size is agreed at creation; bits may
// change per call).
bool eligible(const at::Tensor& t, const BackendConfig& c) {
  return is_codec_dtype(t.scalar_type()) &&
         t.numel() >= std::max<int64_t>(c.minimal_size, rules::kMinSizeFloor);
}

// Compression is on with max-min at 1..8 bits, or with any other compressor.
bool compressible(const at::Tensor& t, const BackendConfig& c) {
  if (c.compressor == kAutoCompressor) return false;  // no plan rule for this call: exact
  const bool on = !uses_codec(c.compressor) || quantizes(c.bits);
  return on && eligible(t, c);
}

Fp32Work fp32_work(const at::Tensor& t) {
  if (t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()) {
    return {t.view({-1}), true};
  }
  return {t.to(at::kCPU, at::kFloat, false, true).contiguous().view({-1}), false};
}

bool uses_codec(const std::string& compressor) {
  // Asked once of every registered compressor, built with its defaults: no name is special here.
  static const std::set<std::string> codecs = [] {
    std::set<std::string> names;
    for (const CompressorEntry& e : compressor_registry()) {
      if (make_compressor(e.name)->codec() != nullptr) names.insert(e.name);
    }
    return names;
  }();
  return codecs.count(compressor) != 0;
}

std::map<std::string, double> compressor_params_of(const BackendConfig& c) {
  if (!uses_codec(c.compressor)) return c.compressor_params;
  return {{"bits", double(c.bits)},
          {"bucket_size", double(c.bucket_size)},
          {"skip_incomplete_buckets", c.skip_incomplete_buckets ? 1.0 : 0.0},
          {"stochastic", c.stochastic ? 1.0 : 0.0},
          {"clip", clip_rule(c.clip, rotates(c)) ? 1.0 : 0.0}};
}

std::unique_ptr<Compressor> make_call_compressor(const BackendConfig& c) {
  return make_compressor(c.compressor, compressor_params_of(c));
}

bool rotation_rule(const std::string& rotation, int bits, int64_t bucket_size,
                   const std::string& compressor) {
  if (!uses_codec(compressor) || rotation == "off") return false;
  return rotation::valid_block(bucket_size) && (rotation == "on" || bits <= 4);
}

bool clip_rule(const std::string& clip, bool rotates) {
  return clip == "on" || (clip == "auto" && rotates);
}

bool rotates(const BackendConfig& c) {
  return rotation_rule(c.rotation, c.bits, c.bucket_size, c.compressor);
}

CallOptions::CallOptions(const BackendConfig& config) : config_(config) {
  validate_fields(config_);
  const bool automatic = config_.compressor == kAutoCompressor;
  compressed_ = !automatic && (!uses_codec(config_.compressor) || quantizes(config_.bits));
  rotates_ = rotation_rule(config_.rotation, config_.bits, config_.bucket_size, config_.compressor);
  clips_ = uses_codec(config_.compressor) && clip_rule(config_.clip, rotates_);
  // Built here, once: also what names a bad compressor name or parameter. Max-min at 32 bits
  // does not compress, so it has no compressor (bits 32 is outside the codec's range).
  // A compressor written in Python has none here: the device plane runs it.
  if (compressed_ && !is_external_compressor(config_.compressor)) {
    compressor_ = make_call_compressor(config_);
  }
}

void CallOptions::set_stream(int64_t stream) {
  CGX_CHECK_ARG(stream >= -1, "stream must be >= 0, or -1 for the group's call counter, got ",
                stream);
  config_.stream = stream;
}

AllreduceOptions to_options(const CallOptions& c, bool average, uint64_t call_index) {
  AllreduceOptions o = to_options(c.config(), average, call_index);
  o.codec.clip = c.clips();
  o.compressor = c.compressor();
  return o;
}

AllreduceOptions to_options(const BackendConfig& c, bool average, uint64_t call_index) {
  AllreduceOptions o;
  o.codec.bits = c.bits;
  o.codec.bucket_size = c.bucket_size;
  o.codec.skip_incomplete_buckets = c.skip_incomplete_buckets;
  o.codec.rounding = c.stochastic ? Rounding::kStochastic : Rounding::kNearest;
  o.codec.seed = c.seed;
  o.codec.clip = uses_codec(c.compressor) && clip_rule(c.clip, rotates(c));
  o.algorithm = algorithm_from_int(c.algorithm);
  o.average = average;
  o.fusion_bytes = size_t(c.fusion_buffer_bytes);
  o.segment_bytes = size_t(c.pipeline_segment_bytes);
  o.pipeline_sparse = c.pipeline_sparse;
  o.call_index = c.stream >= 0 ? uint64_t(c.stream) : call_index;
  return o;
}

void validate_config(const BackendConfig& c) {
  validate_fields(c);
  if (c.compressor != kAutoCompressor && !is_external_compressor(c.compressor)) {
    make_compressor(c.compressor, c.compressor_params);  // names the bad name or parameter
  }
}

void validate_fields(const BackendConfig& c) {
  using namespace rules;
  CGX_CHECK_ARG(kBitsRange.ok(c.bits), "bits ", kBitsRange.text, ", got ", c.bits);
  CGX_CHECK_ARG(kBucketSizeRange.ok(c.bucket_size), "bucket_size ", kBucketSizeRange.text, ", got ",
                c.bucket_size);
  CGX_CHECK_ARG(kMinSizeRange.ok(c.minimal_size), "minimal_size ", kMinSizeRange.text, ", got ",
                c.minimal_size);
  // In bytes natively, and finer than the table's MiB below (the tests cut small pieces).
  const int64_t fusion_max = kFusionBufferMbRange.hi, segment_max = kPipelineSegmentMbRange.hi;
  CGX_CHECK_ARG(c.fusion_buffer_bytes >= 1 && c.fusion_buffer_bytes <= fusion_max,
                "fusion_buffer_bytes must be in [1, ", fusion_max, "], got ",
                c.fusion_buffer_bytes);
  CGX_CHECK_ARG(c.pipeline_segment_bytes >= 0 && c.pipeline_segment_bytes <= segment_max,
                "pipeline_segment_bytes must be in [0, ", segment_max, "], got ",
                c.pipeline_segment_bytes);
  algorithm_from_int(c.algorithm);
  CGX_CHECK_ARG(c.rotation == "auto" || c.rotation == "off" ||
                    (c.rotation == "on" && rotation::valid_block(c.bucket_size)),
                "rotation must be auto, off, or on with a bucket_size that is ",
                kRotationBlocksText, ", got ", c.rotation, " (bucket_size ", c.bucket_size, ")");
  CGX_CHECK_ARG(c.clip == "auto" || c.clip == "on" || c.clip == "off",
                "clip must be auto, on or off, got ", c.clip);
  CGX_CHECK_ARG(!uses_codec(c.compressor) || c.compressor_params.empty(),
                "maxmin takes its parameters from bits, bucket_size, skip_incomplete_buckets and "
                "stochastic, not from compressor_params");
  CGX_CHECK_ARG(c.compressor != kAutoCompressor || c.compressor_params.empty(),
                "compressor auto takes no compressor_params");
}

}  // namespace cgx::binding
