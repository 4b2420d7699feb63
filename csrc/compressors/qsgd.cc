// QSGD (Alistarh et al. 2017): per bucket the l2 norm; each value becomes
// sign(x) * norm * l / s with l = floor(s * |x| / norm + u), u uniform in [0, 1) from the
// counter-based generator: unbiased. s = 2^(bits - 1) - 1 levels; a code is the sign (top bit,
// set only for l > 0) and the level (prim::Levels' rule). A bucket holding NaN or Inf sends a NaN
// norm and decodes to NaN. Body: nb x norm f32, then bits-bit codes. Envelope param0: bucket size
// (0: whole tensor), param1: bits (2..8).
#include <cmath>
#include <vector>

#include "bucketed.h"

namespace cgx {
namespace {

class QSGD final : public EnvelopeCompressor {
 public:
  QSGD(const ParamValues& p, uint8_t id)
      : EnvelopeCompressor("qsgd", id),
        bucket_(p.get_int("bucket_size")),
        bits_(int(p.get_int("bits"))) {}
  CompressorTraits traits() const override { return CompressorTraits{}; }  // unbiased, dense
  int64_t alignment() const override { return bucket_ > 0 ? bucket_ : 1; }
  size_t max_encoded_size(int64_t count, DType) const override {
    return kEnvelopeBytes + bucketed::layout(count, bucket_, 1, bits_).body;
  }
  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext& ctx, uint8_t* out,
                size_t capacity) const override {
    const auto l = bucketed::layout(count, bucket_, 1, bits_);
    uint8_t* body = begin_payload(in, dtype, count, capacity, l.body, 0, uint32_t(bucket_),
                                  uint32_t(bits_), out);
    prim::Levels q;
    q.levels = (1 << (bits_ - 1)) - 1;
    q.num = float(q.levels);
    q.neg_add = 1u << (bits_ - 1);
    q.stochastic = true;
    q.key = rng_key(ctx.seed, ctx.stream);
    // Per bucket the l2 norm (prim::stats' sq_sum, NaN when a value is not finite).
    auto norms = [&](int64_t lo, int64_t hi, float* s) {
      double sq[bucketed::kBlockBuckets];
      prim::sq_sums(in, dtype, lo, hi, l.bucket, sq);
      for (int64_t b = 0; b * l.bucket < hi - lo; ++b) {
        s[b] = std::isfinite(sq[b]) ? float(std::sqrt(sq[b])) : NAN;
        bucketed::put_f32(body + 4 * (lo / l.bucket + b), s[b]);
      }
    };
    bucketed::encode_levels(in, dtype, l, body, q, false, norms);
    return kEnvelopeBytes + l.body;
  }
  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG(e.flags == 0, name_, " payload corrupt: unknown flags");
    CGX_CHECK_ARG(e.param1 >= 2 && e.param1 <= 8, name_, " payload corrupt: bits ", e.param1);
    const int bits = int(e.param1);
    const auto l = bucketed::check_body(e, 1, bits, name_);
    const uint8_t* body = payload + kEnvelopeBytes;
    const float levels = float((1 << (bits - 1)) - 1);
    const uint32_t sign = 1u << (bits - 1);
    float table[256];
    bucketed::for_each_bucket(l, [&](int64_t b, int64_t lo, int64_t hi) {
      const float norm = bucketed::get_f32(body + 4 * b);
      for (uint32_t c = 0; c < 2 * sign; ++c) {
        const float mag = norm * (float(c & (sign - 1)) / levels);
        table[c] = (c & sign) ? -mag : mag;
      }
      bucketed::decode_codes(body, l, lo, hi, table, out, out_dtype, add);
    });
  }

 private:
  int64_t bucket_;
  int bits_;
};

}  // namespace

std::vector<ParamSpec> specs_qsgd() {
  return {{"bits", 4, 2, 8, true, "bits per code: a sign and 2^(bits-1) - 1 levels"},
          {"bucket_size", 512, 0, 4294967295.0, true, "values per norm; 0: whole tensor"}};
}

std::unique_ptr<Compressor> make_qsgd(const ParamValues& p, uint8_t id) {
  return std::make_unique<QSGD>(p, id);
}

}  // namespace cgx
