// max-min: bucketed uniform quantization to 1..8 bits (CGX, QNCCL). The codec of csrc/core/codec.h
// as a registered compressor: its own format ('CGXQ', docs/FORMAT.md), bytes and speed unchanged.
#include "core/codec.h"
#include "core/compressor.h"
#include "core/error.h"

namespace cgx {
namespace {

class MaxMin final : public Compressor {
 public:
  explicit MaxMin(const ParamValues& p) {
    params_.bits = int(p.get_int("bits"));
    params_.bucket_size = p.get_int("bucket_size");
    params_.skip_incomplete_buckets = p.get_bool("skip_incomplete_buckets");
    params_.rounding = p.get_bool("stochastic") ? Rounding::kStochastic : Rounding::kNearest;
    params_.clip = p.get_bool("clip");
  }
  const char* name() const override { return "maxmin"; }
  CompressorTraits traits() const override {
    CompressorTraits t;
    t.biased = params_.rounding == Rounding::kNearest;
    return t;
  }
  int64_t alignment() const override { return params_.bucket_size; }
  const CodecParams* codec() const override { return &params_; }
  size_t max_encoded_size(int64_t count, DType dtype) const override {
    return encoded_size(count, dtype, params_);
  }
  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext& ctx, uint8_t* out,
                size_t capacity) const override {
    const size_t need = encoded_size(count, dtype, params_);
    CGX_CHECK_ARG(capacity >= need, "maxmin: output holds ", capacity, " bytes, encode needs ",
                  need);
    CodecParams p = params_;
    p.seed = ctx.seed;
    p.stream = ctx.stream;
    cgx::encode(in, dtype, count, p, out, need);
    return need;
  }
  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    if (add) {
      decode_add(payload, size, out, out_dtype, count);
    } else {
      cgx::decode(payload, size, out, out_dtype, count);
    }
  }
  int64_t payload_count(const uint8_t* payload, size_t size) const override {
    return inspect(payload, size).count;
  }

 private:
  CodecParams params_;
};

}  // namespace

std::vector<ParamSpec> specs_maxmin() {
  return {{"bits", 4, 1, 8, true, "bits per value"},
          {"bucket_size", 512, 1, 4294967295.0, true, "values per (min, step) pair"},
          {"skip_incomplete_buckets", 0, 0, 1, true, "send the incomplete last bucket raw"},
          {"stochastic", 0, 0, 1, true, "stochastic (unbiased) rounding"},
          {"clip", 0, 0, 1, true, "Gaussian-optimal range per bucket (for rotated values)"}};
}

std::unique_ptr<Compressor> make_maxmin(const ParamValues& p, uint8_t /*id*/) {
  return std::make_unique<MaxMin>(p);
}

}  // namespace cgx
