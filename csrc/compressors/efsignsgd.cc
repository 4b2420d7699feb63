// EF-signSGD (Karimireddy et al. 2019): the signs, scaled per bucket by the mean magnitude
// ||x||_1 / n of the bucket, so that the scaled sign keeps the bucket's l1 mass. Biased by
// design: meant to run with error feedback. A bucket holding NaN or Inf sends a NaN scale and
// decodes to NaN. Body: nb x scale f32, then n sign bits (1 = negative). Envelope param0: bucket
// size (0, the default: the whole tensor is one bucket, as in the paper).
#include <cmath>
#include <vector>

#include "bucketed.h"

namespace cgx {
namespace {

class EFSignSGD final : public EnvelopeCompressor {
 public:
  EFSignSGD(const ParamValues& p, uint8_t id)
      : EnvelopeCompressor("efsignsgd", id), bucket_(p.get_int("bucket_size")) {}
  CompressorTraits traits() const override {
    CompressorTraits t;
    t.biased = true;
    return t;
  }
  int64_t alignment() const override { return bucket_ > 0 ? bucket_ : 1; }
  size_t max_encoded_size(int64_t count, DType) const override {
    return kEnvelopeBytes + bucketed::layout(count, bucket_, 1, 1).body;
  }
  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext&, uint8_t* out,
                size_t capacity) const override {
    const auto l = bucketed::layout(count, bucket_, 1, 1);
    uint8_t* body = begin_payload(in, dtype, count, capacity, l.body, 0, uint32_t(bucket_), 0, out);
    bucketed::encode_signs(in, dtype, l, body, [&](int64_t b, const prim::RangeStats& s) {
      const int64_t lo = b * l.bucket, hi = std::min(l.count, lo + l.bucket);
      bucketed::put_f32(body + 4 * b, s.finite ? float(s.abs_sum / double(hi - lo)) : NAN);
    });
    return kEnvelopeBytes + l.body;
  }
  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG(e.flags == 0, name_, " payload corrupt: unknown flags");
    const auto l = bucketed::check_body(e, 1, 1, name_);
    const uint8_t* body = payload + kEnvelopeBytes;
    bucketed::decode_signs(body, l, out, out_dtype, add, [&](int64_t b, bool negative) {
      const float scale = bucketed::get_f32(body + 4 * b);
      return negative ? -scale : scale;
    });
  }

 private:
  int64_t bucket_;
};

}  // namespace

std::vector<ParamSpec> specs_efsignsgd() {
  return {{"bucket_size", 0, 0, 4294967295.0, true, "values per scale; 0: whole tensor"}};
}

std::unique_ptr<Compressor> make_efsignsgd(const ParamValues& p, uint8_t id) {
  return std::make_unique<EFSignSGD>(p, id);
}

}  // namespace cgx
