// TernGrad (Wen et al. 2017): per bucket the scale s = max |x|, and each value becomes s * sign(x)
// with probability |x| / s, else 0: the code is floor(|x| / s + u) (prim::Levels' rule, u from
// the counter-based generator keyed by the encode context): unbiased. Optional clipping (parameter
// clip = c > 0): values are first clipped to +-c * sigma of their bucket (the paper uses c = 2.5),
// which trades a bias for less variance. A bucket holding NaN or Inf sends a NaN scale and decodes
// to NaN. Body: nb x s f32, then 2-bit codes (0: 0, 1: +s, 2: -s; 3 is invalid). Envelope param0:
// bucket size (0: the whole tensor), param1: the clip factor's f32 bits (informational).
#include <cmath>
#include <vector>

#include "bucketed.h"

namespace cgx {
namespace {

class TernGrad final : public EnvelopeCompressor {
 public:
  TernGrad(const ParamValues& p, uint8_t id)
      : EnvelopeCompressor("terngrad", id),
        bucket_(p.get_int("bucket_size")),
        clip_(float(p.get("clip"))) {}
  CompressorTraits traits() const override {
    CompressorTraits t;
    t.biased = clip_ > 0;
    return t;
  }
  int64_t alignment() const override { return bucket_ > 0 ? bucket_ : 1; }
  size_t max_encoded_size(int64_t count, DType) const override {
    return kEnvelopeBytes + bucketed::layout(count, bucket_, 1, 2).body;
  }
  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext& ctx, uint8_t* out,
                size_t capacity) const override {
    const auto l = bucketed::layout(count, bucket_, 1, 2);
    uint32_t clip_bits;
    std::memcpy(&clip_bits, &clip_, 4);
    uint8_t* body =
        begin_payload(in, dtype, count, capacity, l.body, 0, uint32_t(bucket_), clip_bits, out);
    prim::Levels q;  // l = min(floor(min(|x|, s) / s + u), 1); negative: code 2
    q.stochastic = true;
    q.key = rng_key(ctx.seed, ctx.stream);
    auto scales = [&](int64_t lo, int64_t hi, float* s) {
      float abs_max[bucketed::kBlockBuckets];
      double sq[bucketed::kBlockBuckets];
      prim::abs_maxes(in, dtype, lo, hi, l.bucket, abs_max);
      if (clip_ > 0) prim::sq_sums(in, dtype, lo, hi, l.bucket, sq);
      for (int64_t b = 0; b * l.bucket < hi - lo; ++b) {
        const int64_t n = std::min(l.bucket, hi - lo - b * l.bucket);
        s[b] = scale(abs_max[b], clip_ > 0 ? sq[b] : 0.0, n);
        bucketed::put_f32(body + 4 * (lo / l.bucket + b), s[b]);
      }
    };
    bucketed::encode_levels(in, dtype, l, body, q, true, scales);
    return kEnvelopeBytes + l.body;
  }
  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG(e.flags == 0, name_, " payload corrupt: unknown flags");
    const auto l = bucketed::check_body(e, 1, 2, name_);
    const uint8_t* body = payload + kEnvelopeBytes;
    bucketed::check_no_code3(body + l.codes_offset, e.count, name_);
    bucketed::for_each_bucket(l, [&](int64_t b, int64_t lo, int64_t hi) {
      const float s = bucketed::get_f32(body + 4 * b);
      const float table[4] = {std::isnan(s) ? NAN : 0.0f, s, -s, NAN};  // 3: rejected above
      bucketed::decode_codes(body, l, lo, hi, table, out, out_dtype, add);
    });
  }

 private:
  // s = max |x|, or min(max |x|, clip * sqrt(mean x^2)) with clipping (prim::stats' abs_max and
  // sq_sum of the bucket's n values); NaN for a bucket holding NaN or Inf.
  float scale(float abs_max, double sq_sum, int64_t n) const {
    if (!std::isfinite(abs_max)) return NAN;
    if (clip_ <= 0) return abs_max;
    return std::min(abs_max, float(clip_ * std::sqrt(sq_sum / double(n))));
  }

  int64_t bucket_;
  float clip_;
};

}  // namespace

std::vector<ParamSpec> specs_terngrad() {
  return {{"bucket_size", 512, 0, 4294967295.0, true, "values per scale; 0: whole tensor"},
          {"clip", 0, 0, 1000, false, "clip at clip * sigma first (0: off; the paper: 2.5)"}};
}

std::unique_ptr<Compressor> make_terngrad(const ParamValues& p, uint8_t id) {
  return std::make_unique<TernGrad>(p, id);
}

}  // namespace cgx
