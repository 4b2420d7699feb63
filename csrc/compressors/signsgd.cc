// signSGD (Bernstein 2018): one sign bit per value, decoded to +1 or -1 (the learning rate
// scales). x >= 0 (and +-0) is +1, x < 0 is -1. Summed over ranks, the decoded signs are the
// majority vote's tally. A NaN or Inf anywhere sets the envelope's flag bit 0 and the whole
// tensor decodes to NaN: a sign cannot carry it, and silently finite output would hide it.
// signum (Bernstein 2018) is the same code applied to a momentum, which the caller keeps
// (CompressionState(momentum=...)); it is registered under its own name and id.
#include <cmath>
#include <vector>

#include "bucketed.h"

namespace cgx {
namespace {

constexpr uint8_t kFlagNonFinite = 1;

class SignSGD final : public EnvelopeCompressor {
 public:
  using EnvelopeCompressor::EnvelopeCompressor;
  CompressorTraits traits() const override {
    CompressorTraits t;
    t.biased = true;
    return t;
  }
  size_t max_encoded_size(int64_t count, DType) const override {
    return kEnvelopeBytes + prim::packed_bytes(count, 1);
  }
  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext&, uint8_t* out,
                size_t capacity) const override {
    const size_t body_bytes = prim::packed_bytes(count, 1);
    check_encode_args(in, count, capacity, kEnvelopeBytes + body_bytes, name_);
    const bool finite = bucketed::put_signs(in, dtype, count, out + kEnvelopeBytes);
    begin_payload(in, dtype, count, capacity, body_bytes, finite ? 0 : kFlagNonFinite, 0, 0, out);
    return kEnvelopeBytes + body_bytes;
  }
  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG(e.body_bytes == prim::packed_bytes(e.count, 1), name_,
                  " payload corrupt: body of ", e.body_bytes, " bytes for ", e.count, " values");
    CGX_CHECK_ARG((e.flags & ~kFlagNonFinite) == 0, name_, " payload corrupt: unknown flags");
    const bool nan = e.flags & kFlagNonFinite;
    bucketed::decode_signs(payload + kEnvelopeBytes, bucketed::layout(count, 0, 0, 1), out,
                           out_dtype, add, [&](int64_t, bool negative) {
                             return nan ? NAN : negative ? -1.0f : 1.0f;
                           });
  }
};

}  // namespace

std::vector<ParamSpec> specs_signsgd() { return {}; }

std::unique_ptr<Compressor> make_signsgd(const ParamValues&, uint8_t id) {
  return std::make_unique<SignSGD>("signsgd", id);
}

std::vector<ParamSpec> specs_signum() { return {}; }

std::unique_ptr<Compressor> make_signum(const ParamValues&, uint8_t id) {
  return std::make_unique<SignSGD>("signum", id);
}

}  // namespace cgx
