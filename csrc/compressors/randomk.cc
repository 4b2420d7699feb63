// Random-k sparsification (Stich 2018; GRACE's RandomKCompressor): k =
// ceil(ratio * n) values at indices drawn from rng_key(ctx.seed, ctx.shared),
// the same on every rank for one message, so only the values travel and the
// payloads of the ranks can be summed value-wise in transit (summable). The
// envelope carries the derived key, from which decode regenerates the indices
// (prim::random_k); any key gives valid indices. With scale = 1, decode
// multiplies by n / k: unbiased. With scale = 0 it is biased and wants error
// feedback, which is the caller's (stateless). Values travel in the input
// dtype, NaN / Inf included; a NaN or Inf anywhere (sent or not) sets flag bit 1 and the whole
// tensor decodes to NaN, so that a non-finite gradient is never lost by not being drawn.
// Payload: docs/FORMAT.md, "Sparse compressors" ("randomk").
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "spans.h"
#include "sparse_common.h"

namespace cgx {
namespace {

constexpr uint8_t kFlagScale = 1;
constexpr uint8_t kFlagNonFinite = 2;

// Whether every value of [lo, hi) is finite; copies the values at the drawn indices (ascending)
// that fall in [lo, hi) to their place in `body`, a block at a time after its check read it.
bool check_and_gather(const void* in, DType t, int64_t lo, int64_t hi,
                      const std::vector<uint32_t>& idx, uint8_t* body) {
  constexpr int64_t kBlock = 8192;
  const size_t es = elem_size(t);
  const auto* src = static_cast<const uint8_t*>(in);
  size_t j = size_t(std::lower_bound(idx.begin(), idx.end(), uint64_t(lo)) - idx.begin());
  bool finite = true;
  for (int64_t b = lo; b < hi; b += kBlock) {
    const int64_t e = std::min(hi, b + kBlock);
    finite &= sparse::all_finite(in, t, b, e);
    for (; j < idx.size() && idx[j] < uint64_t(e); ++j) {
      std::memcpy(body + j * es, src + size_t(idx[j]) * es, es);
    }
  }
  return finite;
}

class RandomK final : public EnvelopeCompressor {
 public:
  RandomK(const char* name, uint8_t id, double ratio, bool scale)
      : EnvelopeCompressor(name, id), ratio_(ratio), scale_(scale) {}

  CompressorTraits traits() const override {
    CompressorTraits t;
    t.biased = !scale_;
    t.summable = true;
    t.sparse = true;
    return t;
  }

  size_t max_encoded_size(int64_t count, DType dtype) const override {
    return kEnvelopeBytes + size_t(sparse::count_for(ratio_, count)) * elem_size(dtype);
  }

  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext& ctx, uint8_t* out,
                size_t capacity) const override {
    check_encode_args(in, count, capacity, 0, name_);
    sparse::check_index_count(count, name_, ": ");
    const int64_t k = sparse::count_for(ratio_, count);
    const uint64_t body_bytes = uint64_t(k) * elem_size(dtype);
    const RngKey key = rng_key(ctx.seed, ctx.shared);
    check_encode_args(in, count, capacity, kEnvelopeBytes + body_bytes, name_);
    // The indices (one sequential draw), then spans on the codec's pool that check every value
    // and copy the drawn ones while they are in cache.
    const std::vector<uint32_t> idx = prim::random_k(count, k, key);
    std::atomic<bool> finite{true};
    spans::for_each_span(count, 8, [&](int64_t lo, int64_t hi) {
      if (!check_and_gather(in, dtype, lo, hi, idx, out + kEnvelopeBytes)) finite.store(false);
    });
    const uint8_t flags = uint8_t((scale_ ? kFlagScale : 0) | (finite ? 0 : kFlagNonFinite));
    begin_payload(in, dtype, count, capacity, body_bytes, flags, key.k0, key.k1, out);
    return kEnvelopeBytes + body_bytes;
  }

  SummableSection summable_section(const uint8_t* payload, size_t size) const override {
    const Envelope e = read_envelope(payload, size, id_, name_);
    return SummableSection{kEnvelopeBytes, sparse::count_for(ratio_, e.count), e.dtype};
  }

  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG((e.flags & ~(kFlagScale | kFlagNonFinite)) == 0, name_,
                  " payload corrupt: unknown flags ", int(e.flags));
    CGX_CHECK_ARG(bool(e.flags & kFlagScale) == scale_, name_,
                  " payload was encoded with scale=", int(e.flags & kFlagScale),
                  ", this decoder has scale=", int(scale_));
    sparse::check_index_count(e.count, name_, " payload corrupt: ");
    const int64_t k = sparse::count_for(ratio_, e.count);
    CGX_CHECK_ARG(e.body_bytes == uint64_t(k) * elem_size(e.dtype), name_,
                  " payload corrupt: body of ", e.body_bytes, " bytes, expected ", k, " values of ",
                  dtype_name(e.dtype), " for ", e.count, " values at ratio ", ratio_);
    const std::vector<uint32_t> idx = prim::random_k(e.count, k, RngKey{e.param0, e.param1});
    const float factor = scale_ && k > 0 ? float(double(e.count) / double(k)) : 1.0f;
    const uint8_t* body = payload + kEnvelopeBytes;
    if (e.flags & kFlagNonFinite) {
      for (int64_t i = 0; i < count; ++i) prim::put_value(out, out_dtype, i, NAN, add);
      return;
    }
    prim::clear(out, out_dtype, count, add);
    for (size_t j = 0; j < idx.size(); ++j) {
      float v = sparse::read_value(body, e.dtype, j);
      if (scale_) v *= factor;
      prim::put_value(out, out_dtype, idx[j], v, add);
    }
  }

 private:
  double ratio_;
  bool scale_;
};

}  // namespace

std::vector<ParamSpec> specs_randomk() {
  return {{"ratio", 0.01, 0, 1, false, "fraction of the values sent, in (0, 1]"},
          {"scale", 0, 0, 1, true, "1: decode multiplies by n / k (unbiased)"}};
}

std::unique_ptr<Compressor> make_randomk(const ParamValues& params, uint8_t id) {
  sparse::check_positive(params, "randomk", "ratio");
  return std::make_unique<RandomK>("randomk", id, params.get("ratio"), params.get_bool("scale"));
}

}  // namespace cgx
