// fp16 / bf16: every value cast to a 16-bit float, round to nearest even (PyTorch's
// fp16_compress_hook / bf16_compress_hook). Payload: envelope + count 16-bit values. Summable in
// transit: the payloads of one message can be reduced as 16-bit tensors.
#include <cstring>

#include "core/compressor.h"
#include "core/error.h"
#include "core/primitives.h"
#include "spans.h"

namespace cgx {
namespace {

class Cast final : public EnvelopeCompressor {
 public:
  Cast(const char* name, DType wire, uint8_t id) : EnvelopeCompressor(name, id), wire_(wire) {}
  CompressorTraits traits() const override {
    CompressorTraits t;
    t.summable = true;  // relative error <= 2^-11 (fp16) / 2^-8 (bf16): no error feedback needed
    return t;
  }
  size_t max_encoded_size(int64_t count, DType) const override {
    return kEnvelopeBytes + size_t(count) * 2;
  }
  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext&, uint8_t* out,
                size_t capacity) const override {
    uint8_t* body = begin_payload(in, dtype, count, capacity, uint64_t(count) * 2, 0, 0, 0, out);
    spans::for_each_span(count, 8, [&](int64_t lo, int64_t hi) {  // on the codec's pool
      prim::convert(spans::at(in, dtype, lo), dtype, body + 2 * lo, wire_, hi - lo, false);
    });
    return kEnvelopeBytes + size_t(count) * 2;
  }
  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG(e.body_bytes == uint64_t(e.count) * 2, name_, " payload corrupt: body of ",
                  e.body_bytes, " bytes for ", e.count, " values");
    prim::convert(payload + kEnvelopeBytes, wire_, out, out_dtype, count, add);
  }

 private:
  DType wire_;
};

}  // namespace

std::vector<ParamSpec> specs_fp16() { return {}; }
std::vector<ParamSpec> specs_bf16() { return {}; }

std::unique_ptr<Compressor> make_fp16(const ParamValues&, uint8_t id) {
  return std::make_unique<Cast>("fp16", DType::kFloat16, id);
}
std::unique_ptr<Compressor> make_bf16(const ParamValues&, uint8_t id) {
  return std::make_unique<Cast>("bf16", DType::kBFloat16, id);
}

}  // namespace cgx
