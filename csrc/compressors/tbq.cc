// TBQ, threshold binary quantization (Strom 2015, as in HiPress): +tau where x >= tau, -tau where
// x <= -tau, 0 elsewhere, decided as |x| / tau >= 1 in fp32 (prim::Levels' rule). Meant to run on a
// residual (the caller adds the gradient to it and subtracts what was sent): biased. NaN or Inf
// anywhere sets flag bit 0 and the whole tensor decodes to NaN (a code cannot carry it). Body:
// 2-bit codes (0: 0, 1: +tau, 2: -tau; 3 is invalid). Envelope param1: tau's f32 bits.
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "bucketed.h"

namespace cgx {
namespace {

constexpr uint8_t kFlagNonFinite = 1;

class TBQ final : public EnvelopeCompressor {
 public:
  TBQ(const ParamValues& p, uint8_t id)
      : EnvelopeCompressor("tbq", id), tau_(float(p.get("tau"))) {}
  CompressorTraits traits() const override {
    CompressorTraits t;
    t.biased = true;
    return t;
  }
  size_t max_encoded_size(int64_t count, DType) const override {
    return kEnvelopeBytes + prim::packed_bytes(count, 2);
  }
  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext&, uint8_t* out,
                size_t capacity) const override {
    const size_t body_bytes = prim::packed_bytes(count, 2);
    check_encode_args(in, count, capacity, kEnvelopeBytes + body_bytes, name_);
    prim::Levels q;  // l = min(floor(|x| / tau), 1): |x| / tau >= 1 in fp32; negative: code 2
    q.den = tau_;
    std::atomic<bool> finite{true};  // spans of whole bytes (4 codes each) on the codec's pool
    spans::for_each_span(count, 8, [&](int64_t lo, int64_t hi) {
      prim::BitWriter w(out + kEnvelopeBytes + lo / 4, 2);
      if (!bucketed::put_levels(in, dtype, lo, hi, q, w)) {
        finite.store(false, std::memory_order_relaxed);
      }
      w.finish();
    });
    uint32_t tau_bits;
    std::memcpy(&tau_bits, &tau_, 4);
    begin_payload(in, dtype, count, capacity, body_bytes, finite ? 0 : kFlagNonFinite, 0, tau_bits,
                  out);
    return kEnvelopeBytes + body_bytes;
  }
  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG((e.flags & ~kFlagNonFinite) == 0, name_, " payload corrupt: unknown flags");
    CGX_CHECK_ARG(e.body_bytes == prim::packed_bytes(e.count, 2), name_,
                  " payload corrupt: body of ", e.body_bytes, " bytes for ", e.count, " values");
    float tau;
    std::memcpy(&tau, &e.param1, 4);
    const bool nan = e.flags & kFlagNonFinite;
    const uint8_t* codes = payload + kEnvelopeBytes;
    bucketed::check_no_code3(codes, e.count, name_);
    const float table[4] = {nan ? NAN : 0.0f, nan ? NAN : tau, nan ? NAN : -tau, NAN};
    prim::decode_table(codes, e.body_bytes, 2, 0, count, table, out, out_dtype, add);
  }

 private:
  float tau_;
};

}  // namespace

std::vector<ParamSpec> specs_tbq() {
  return {{"tau", 1.0, 1e-30, 1e30, false, "threshold and magnitude of what is sent"}};
}

std::unique_ptr<Compressor> make_tbq(const ParamValues& p, uint8_t id) {
  return std::make_unique<TBQ>(p, id);
}

}  // namespace cgx
