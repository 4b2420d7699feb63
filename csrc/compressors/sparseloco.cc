// SparseLoCo-style sparsification (arXiv 2508.15706): the tensor is cut into chunks of `chunk`
// values; in each chunk the k = k(ratio, chunk length) values of largest magnitude are kept
// (prim::top_k: exact, ties to the lower index, NaN above +Inf) and travel as a chunk-relative
// index (u16 when chunk <= 65536, else u32) and a `bits`-bit code: the sign (top bit) and a level
// l of 2^(bits-1) magnitudes a + l * d spread uniformly over [min, max] of the kept |x| (bits = 1:
// the sign alone, magnitude the mean kept |x|). A chunk whose kept values hold NaN or Inf sends
// NaN scalars, so they decode to NaN. Stateless: error feedback is the caller's. Deterministic.
// Payload: docs/FORMAT.md, "sparseloco".
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "bucketed.h"
#include "spans.h"
#include "sparse_common.h"

namespace cgx {
namespace {

struct Shape {
  int64_t chunks = 0;    // nc
  int64_t kept = 0;      // K, sum of the per-chunk k
  int index_bytes = 2;   // 2 or 4
  size_t idx_off = 0;    // the index array's offset in the body
  size_t codes_off = 0;  // the packed codes' offset in the body
  size_t body = 0;
};

class SparseLoCo final : public EnvelopeCompressor {
 public:
  SparseLoCo(const ParamValues& p, uint8_t id)
      : EnvelopeCompressor("sparseloco", id),
        ratio_(p.get("ratio")),
        chunk_(p.get_int("chunk")),
        bits_(int(p.get_int("bits"))) {}

  CompressorTraits traits() const override {
    CompressorTraits t;
    t.biased = true;
    t.sparse = true;
    t.fixed_size = true;
    return t;
  }
  int64_t alignment() const override { return chunk_; }
  size_t max_encoded_size(int64_t count, DType) const override {
    return kEnvelopeBytes + shape(std::max<int64_t>(count, 0)).body;
  }
  int64_t payload_count(const uint8_t* payload, size_t size) const override {
    return check_header(read_envelope(payload, size, id_, name_)).count;
  }

  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext&, uint8_t* out,
                size_t capacity) const override {
    check_encode_args(in, count, capacity, 0, name_);
    const Shape s = shape(count);
    uint8_t* body = begin_payload(in, dtype, count, capacity, s.body, 0, uint32_t(chunk_),
                                  uint32_t(bits_), out);
    // Spans of whole chunks on the codec's pool, eight chunks at a time (so that a span's codes
    // start at a whole byte); every chunk before a span's first is full.
    spans::for_each_span(count, 8 * chunk_, [&](int64_t lo, int64_t hi) {
      encode_chunks(in, dtype, count, s, lo / chunk_, (hi + chunk_ - 1) / chunk_, body);
    });
    return kEnvelopeBytes + s.body;
  }

  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    check_header(open_payload(payload, size, out, count));
    const Shape s = shape(count);
    const uint8_t* body = payload + kEnvelopeBytes;
    for_each_index(body, s, count, [&](int64_t c, int64_t j, int64_t len, uint32_t i, uint32_t p) {
      CGX_CHECK_ARG(i < len, name_, " payload corrupt: index ", i, " (kept value ", j,
                    ") out of range for chunk ", c, " of ", len, " values");
      CGX_CHECK_ARG(j == 0 || i > p, name_, " payload corrupt: index ", i, " (kept value ", j,
                    ") not above the previous one of chunk ", c, " (strictly ascending)");
    });
    prim::clear(out, out_dtype, count, add);
    prim::BitReader r(body + s.codes_off, bits_, 0);
    const uint32_t sign = 1u << (bits_ - 1);
    for_each_index(body, s, count, [&](int64_t c, int64_t, int64_t, uint32_t i, uint32_t) {
      const float a = bucketed::get_f32(body + 8 * c), d = bucketed::get_f32(body + 8 * c + 4);
      const uint32_t q = r.get();
      const float mag = bits_ == 1 ? a : a + float(q & (sign - 1)) * d;
      prim::put_value(out, out_dtype, c * chunk_ + i, (q & sign) ? -mag : mag, add);
    });
  }

 private:
  // The body's layout for `count` values (docs/FORMAT.md).
  Shape shape(int64_t count) const {
    Shape s;
    s.chunks = (count + chunk_ - 1) / chunk_;
    const int64_t full = count / chunk_, tail = count - full * chunk_;
    s.kept = full * sparse::count_for(ratio_, chunk_) + sparse::count_for(ratio_, tail);
    s.index_bytes = chunk_ <= 65536 ? 2 : 4;
    s.idx_off = size_t(s.chunks) * 8;
    s.codes_off = s.idx_off + size_t(s.kept) * size_t(s.index_bytes);
    s.body = s.codes_off + prim::packed_bytes(s.kept, bits_);
    return s;
  }

  // The envelope's fields against this compressor's parameters and the count's exact body.
  Envelope check_header(const Envelope& e) const {
    CGX_CHECK_ARG(e.flags == 0, name_, " payload corrupt: unknown flags ", int(e.flags));
    CGX_CHECK_ARG(e.param0 == uint32_t(chunk_) && e.param1 == uint32_t(bits_), name_,
                  " payload of chunk ", e.param0, ", bits ", e.param1,
                  " given to a decoder of chunk ", chunk_, ", bits ", bits_);
    const size_t want = shape(e.count).body;
    CGX_CHECK_ARG(e.body_bytes == want, name_, " payload corrupt: body of ", e.body_bytes,
                  " bytes, ", e.count, " values need ", want);
    return e;
  }

  // Chunks [c0, c1) (c0 a multiple of 8): their scalars, indices and codes.
  void encode_chunks(const void* in, DType dtype, int64_t count, const Shape& s, int64_t c0,
                     int64_t c1, uint8_t* body) const {
    const int64_t k_full = sparse::count_for(ratio_, chunk_);
    const int64_t before = c0 * k_full;  // kept values of the chunks before c0
    prim::BitWriter w(body + s.codes_off + size_t(before) * size_t(bits_) / 8, bits_);
    uint8_t* idx_out = body + s.idx_off + size_t(before) * size_t(s.index_bytes);
    prim::TopKScratch scratch;
    std::vector<uint32_t> idx(size_t(std::min(k_full, count)));
    std::vector<float> v(idx.size());
    std::vector<uint8_t> codes(idx.size());
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = c * chunk_, len = std::min(chunk_, count - lo);
      const int64_t k = sparse::count_for(ratio_, len);
      const void* chunk = spans::at(in, dtype, lo);
      prim::top_k_into(chunk, dtype, len, k, scratch, idx.data());
      gather(chunk, dtype, idx.data(), k, v.data());
      float a = 0, d = 0;
      scalars(v.data(), k, &a, &d);
      bucketed::put_f32(body + 8 * c, a);
      bucketed::put_f32(body + 8 * c + 4, d);
      to_codes(v.data(), k, a, d, codes.data());
      w.put_codes(codes.data(), k);
      if (s.index_bytes == 2) {
        for (int64_t j = 0; j < k; ++j) {
          const uint16_t i = uint16_t(idx[size_t(j)]);
          std::memcpy(idx_out + 2 * j, &i, 2);  // little-endian hosts
        }
      } else {
        std::memcpy(idx_out, idx.data(), size_t(k) * 4);
      }
      idx_out += k * s.index_bytes;
    }
    w.finish();
  }

  // v[j] = x[idx[j]] as float, j < k.
  static void gather(const void* x, DType t, const uint32_t* idx, int64_t k, float* v) {
    if (t == DType::kFloat32) {
      const auto* p = static_cast<const uint8_t*>(x);
      for (int64_t j = 0; j < k; ++j) std::memcpy(v + j, p + 4 * size_t(idx[j]), 4);
      return;
    }
    for (int64_t j = 0; j < k; ++j) v[j] = load_as_float(x, t, idx[j]);
  }

  // Per chunk: magnitude a of level 0 and step d (bits = 1: a = mean |v|, d = 0); NaN for both
  // when a kept value is not finite.
  void scalars(const float* v, int64_t n, float* a, float* d) const {
    if (n == 0) return;
    float lo = INFINITY, hi = 0;
    bool finite = true;
    for (int64_t j = 0; j < n; ++j) {  // no early exit: a loop the compiler vectorizes
      const float m = std::fabs(v[j]);
      finite &= m <= FLT_MAX;  // false for Inf and NaN
      lo = m < lo ? m : lo;
      hi = m > hi ? m : hi;
    }
    if (!finite) {
      *a = *d = NAN;
      return;
    }
    if (bits_ == 1) {
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += double(std::fabs(v[j]));
      *a = float(sum / double(n));
      return;
    }
    *a = lo;
    *d = (hi - lo) / float((1 << (bits_ - 1)) - 1);
  }

  // The code of each kept value v[j], j < n: the sign (top bit, set for x < 0) and the level
  // min(max(floor((|x| - a) / d + 0.5), 0), L) (0 when d is not a positive finite number), in
  // fp32. a is the smallest kept |x|, so |x| - a >= 0.
  void to_codes(const float* v, int64_t n, float a, float d, uint8_t* c) const {
    const uint32_t sign = 1u << (bits_ - 1);
    if (bits_ == 1 || !(d > 0) || !std::isfinite(d)) {
      for (int64_t j = 0; j < n; ++j) c[j] = uint8_t(v[j] < 0 ? sign : 0u);
      return;
    }
    // min(floor(y), L) for y = (|x| - a) / d + 0.5 >= 0.5 is the truncation of min(y, L).
    const float levels = float(sign - 1);
    for (int64_t j = 0; j < n; ++j) {
      const float y = (std::fabs(v[j]) - a) / d + 0.5f;
      c[j] = uint8_t((v[j] < 0 ? sign : 0u) | uint32_t(int32_t(y < levels ? y : levels)));
    }
  }

  // fn(chunk, kept index j within the chunk, chunk length, index, previous index) for every
  // stored index, in order.
  template <typename F>
  void for_each_index(const uint8_t* body, const Shape& s, int64_t count, F&& fn) const {
    const uint8_t* p = body + s.idx_off;
    for (int64_t c = 0; c < s.chunks; ++c) {
      const int64_t len = std::min(chunk_, count - c * chunk_);
      const int64_t k = sparse::count_for(ratio_, len);
      uint32_t prev = 0;
      for (int64_t j = 0; j < k; ++j, p += s.index_bytes) {
        uint32_t i = 0;
        std::memcpy(&i, p, size_t(s.index_bytes));
        fn(c, j, len, i, prev);
        prev = i;
      }
    }
  }

  double ratio_;
  int64_t chunk_;
  int bits_;
};

}  // namespace

std::vector<ParamSpec> specs_sparseloco() {
  return {{"ratio", 0.03, 0, 1, false, "fraction of each chunk kept, in (0, 1]: k = ceil(ratio L)"},
          {"chunk", 4096, 1, 4294967295.0, true, "values per chunk (indices u16 up to 65536)"},
          {"bits", 2, 1, 8, true, "bits per kept value: a sign and 2^(bits-1) magnitude levels"}};
}

std::unique_ptr<Compressor> make_sparseloco(const ParamValues& params, uint8_t id) {
  sparse::check_positive(params, "sparseloco", "ratio");
  return std::make_unique<SparseLoCo>(params, id);
}

}  // namespace cgx
