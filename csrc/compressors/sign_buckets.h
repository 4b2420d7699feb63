// Shared by the bucketed sign compressors (onebit, efsignsgd): per bucket `Scalars` f32 values,
// then one sign bit per value (1 = negative); envelope param0: the bucket size (0: the whole
// tensor is one bucket); biased by design (meant for error feedback). `Codec` (CRTP) gives a
// bucket's scalars, `put_scalars(at, stats, n)`, from prim::stats' fp64 sums of its n values,
// and the value a sign decodes to, `value(scalars, negative)`.
#pragma once

#include <algorithm>

#include "bucketed.h"

namespace cgx::bucketed {

template <class Codec, int Scalars>
class SignBuckets : public EnvelopeCompressor {
 public:
  SignBuckets(const char* name, const ParamValues& p, uint8_t id)
      : EnvelopeCompressor(name, id), bucket_(p.get_int("bucket_size")) {}
  CompressorTraits traits() const override {
    CompressorTraits t;
    t.biased = true;
    return t;
  }
  int64_t alignment() const override { return bucket_ > 0 ? bucket_ : 1; }
  size_t max_encoded_size(int64_t count, DType) const override {
    return kEnvelopeBytes + layout(count, bucket_, Scalars, 1).body;
  }
  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext&, uint8_t* out,
                size_t capacity) const override {
    const auto l = layout(count, bucket_, Scalars, 1);
    uint8_t* body = begin_payload(in, dtype, count, capacity, l.body, 0, uint32_t(bucket_), 0, out);
    encode_signs(in, dtype, l, body, [&](int64_t b, const prim::RangeStats& s) {
      const int64_t lo = b * l.bucket, hi = std::min(l.count, lo + l.bucket);
      Codec::put_scalars(body + 4 * Scalars * b, s, hi - lo);
    });
    return kEnvelopeBytes + l.body;
  }
  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG(e.flags == 0, name_, " payload corrupt: unknown flags");
    const auto l = check_body(e, Scalars, 1, name_);
    const uint8_t* body = payload + kEnvelopeBytes;
    decode_signs(body, l, out, out_dtype, add, [&](int64_t b, bool negative) {
      return Codec::value(body + 4 * Scalars * b, negative);
    });
  }

 private:
  int64_t bucket_;
};

}  // namespace cgx::bucketed
