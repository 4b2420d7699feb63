// TernGrad (Wen et al. 2017): per bucket the scale s = max |x|, and each value becomes s * sign(x)
// with probability |x| / s, else 0 (stochastic, from the counter-based generator keyed by the
// encode context): unbiased. Optional clipping (parameter clip = c > 0): values are first clipped
// to +-c * sigma of their bucket (the paper uses c = 2.5), which trades a bias for less variance.
// A bucket holding NaN or Inf sends a NaN scale and decodes to NaN.
// Body: nb x s f32, then 2-bit codes (0: 0, 1: +s, 2: -s; 3 is invalid). Envelope param0: bucket
// size (0: the whole tensor), param1: the clip factor's f32 bits (informational).
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
    std::vector<uint8_t> codes(static_cast<size_t>(count));
    const RngKey key = rng_key(ctx.seed, ctx.stream);
    for (int64_t b = 0; b < l.buckets; ++b) {
      const int64_t lo = b * l.bucket, hi = std::min(count, lo + l.bucket);
      const prim::RangeStats st = prim::stats(in, dtype, lo, hi);
      float s = st.finite ? st.abs_max : NAN;
      if (clip_ > 0 && st.finite) {
        const double n = double(hi - lo), mean = 0;  // sigma about 0: gradients are centred
        const double sigma = std::sqrt(st.sq_sum / n - mean * mean);
        s = std::min(s, float(clip_ * sigma));
      }
      bucketed::put_f32(body + 4 * b, s);
      for (int64_t i = lo; i < hi; ++i) {
        const float v = std::clamp(load_as_float(in, dtype, i), -s, s);
        const bool keep = s > 0 && rng_uniform(key, uint64_t(i)) < std::fabs(v) / s;
        codes[size_t(i)] = !std::isfinite(s) || !keep ? 0 : (v < 0 ? 2 : 1);
      }
    }
    prim::pack(codes.data(), count, 2, body + l.codes_offset);
    return kEnvelopeBytes + l.body;
  }
  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG(e.flags == 0, name_, " payload corrupt: unknown flags");
    const auto l = bucketed::check_body(e, 1, 2, name_);
    const uint8_t* body = payload + kEnvelopeBytes;
    for (int64_t i = 0; i < count; ++i) {
      const float s = bucketed::get_f32(body + 4 * (i / l.bucket));
      const uint32_t c = prim::unpack_one(body + l.codes_offset, i, 2);
      CGX_CHECK_ARG(c != 3, name_, " payload corrupt: code 3 at element ", i);
      const float v = std::isnan(s) ? NAN : c == 0 ? 0.0f : c == 1 ? s : -s;
      prim::put_value(out, out_dtype, i, v, add);
    }
  }

 private:
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
