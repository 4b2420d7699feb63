// onebit (Seide et al. 2014): one sign bit per value; per bucket the mean of its negative values
// and the mean of its non-negative values (sums (sum x -+ sum |x|) / 2 of prim::stats' fp64
// lanes), which the bits select on decode. Biased: pair it with
// error feedback (the original keeps the residual). A bucket holding NaN or Inf sends NaN means
// and decodes to NaN. Body: nb x (neg_mean f32, pos_mean f32), then n sign bits (1 = negative).
// Envelope param0: bucket size (0 = the whole tensor is one bucket).
#include <cmath>
#include <vector>

#include "bucketed.h"

namespace cgx {
namespace {

class OneBit final : public EnvelopeCompressor {
 public:
  OneBit(const ParamValues& p, uint8_t id)
      : EnvelopeCompressor("onebit", id), bucket_(p.get_int("bucket_size")) {}
  CompressorTraits traits() const override {
    CompressorTraits t;
    t.biased = true;
    return t;
  }
  int64_t alignment() const override { return bucket_ > 0 ? bucket_ : 1; }
  size_t max_encoded_size(int64_t count, DType) const override {
    return kEnvelopeBytes + bucketed::layout(count, bucket_, 2, 1).body;
  }
  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext&, uint8_t* out,
                size_t capacity) const override {
    const auto l = bucketed::layout(count, bucket_, 2, 1);
    uint8_t* body = begin_payload(in, dtype, count, capacity, l.body, 0, uint32_t(bucket_), 0, out);
    bucketed::encode_signs(in, dtype, l, body, [&](int64_t b, const prim::RangeStats& st) {
      const double neg = (st.sum - st.abs_sum) / 2, pos = (st.sum + st.abs_sum) / 2;
      const int64_t lo = b * l.bucket, hi = std::min(l.count, lo + l.bucket);
      const int64_t nneg = st.negatives, npos = hi - lo - nneg;
      const float nm = !st.finite ? NAN : nneg ? float(neg / double(nneg)) : 0.0f;
      const float pm = !st.finite ? NAN : npos ? float(pos / double(npos)) : 0.0f;
      bucketed::put_f32(body + 8 * b, nm);
      bucketed::put_f32(body + 8 * b + 4, pm);
    });
    return kEnvelopeBytes + l.body;
  }
  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG(e.flags == 0, name_, " payload corrupt: unknown flags");
    const auto l = bucketed::check_body(e, 2, 1, name_);
    const uint8_t* body = payload + kEnvelopeBytes;
    bucketed::decode_signs(body, l, out, out_dtype, add, [&](int64_t b, bool negative) {
      return bucketed::get_f32(body + 8 * b + (negative ? 0 : 4));
    });
  }

 private:
  int64_t bucket_;
};

}  // namespace

std::vector<ParamSpec> specs_onebit() {
  return {{"bucket_size", 512, 0, 4294967295.0, true, "values per pair of means; 0: whole tensor"}};
}

std::unique_ptr<Compressor> make_onebit(const ParamValues& p, uint8_t id) {
  return std::make_unique<OneBit>(p, id);
}

}  // namespace cgx
