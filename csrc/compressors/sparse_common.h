// Shared by the sparsifying compressors (topk, threshold, dgc, graddrop; randomk uses the
// helpers): counts from fractions, the u32 index limit, the magnitude order, value access in
// the input dtype, and the (index, value) pair payload (docs/FORMAT.md, "Sparse compressors").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/compressor.h"
#include "core/error.h"
#include "core/primitives.h"
#include "spans.h"

namespace cgx::sparse {

constexpr int64_t kMaxIndexCount = (int64_t(1) << 32) - 1;

// k = ceil(fraction * n) for n > 0, clamped to [1, n]; the 1e-6 absorbs the binary rounding of
// decimal fractions (0.07 * 100 is 7.000000000000001 in double).
inline int64_t count_for(double fraction, int64_t n) {
  if (n <= 0) return 0;
  const double k = std::ceil(fraction * double(n) - 1e-6);
  if (!(k >= 1)) return 1;
  return k >= double(n) ? n : int64_t(k);
}

// Indices travel as u32.
inline void check_index_count(int64_t count, const char* name, const char* what) {
  CGX_CHECK_ARG(count <= kMaxIndexCount, name, what, "element count ", count,
                " exceeds 2^32 - 1 (indices are u32; split the tensor)");
}

// |x| for selection, NaN above +Inf (the order of prim::top_k).
inline float magnitude(float v) {
  const float a = std::fabs(v);
  return std::isnan(a) ? INFINITY : a;
}

// Value j of a packed array of `t` (any alignment).
inline float read_value(const uint8_t* p, DType t, uint64_t j) {
  if (t == DType::kFloat32) {
    uint32_t u;
    std::memcpy(&u, p + 4 * j, 4);
    return bits_float(u);
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * j, 2);
  return t == DType::kFloat16 ? half_to_float(h) : bf16_to_float(h);
}

inline uint32_t read_u32(const uint8_t* p, uint64_t j) {
  uint32_t u;
  std::memcpy(&u, p + 4 * j, 4);
  return u;
}

// Whether every value of [lo, hi) is finite (prim::abs_maxes, a block of 8192 values at a time).
inline bool all_finite(const void* in, DType t, int64_t lo, int64_t hi) {
  constexpr int64_t kBlock = 8192, kBlocks = 64;
  float m[kBlocks];
  for (int64_t b = lo; b < hi; b += kBlock * kBlocks) {
    const int64_t e = std::min(hi, b + kBlock * kBlocks);
    prim::abs_maxes(in, t, b, e, kBlock, m);
    for (int64_t j = 0; j * kBlock < e - b; ++j) {
      if (!std::isfinite(m[j])) return false;
    }
  }
  return true;
}

// Copies in[idx[j]] (raw bytes of `t`) to out[j].
inline void gather_values(const void* in, DType t, const std::vector<uint32_t>& idx, uint8_t* out) {
  const size_t es = elem_size(t);
  const auto* src = static_cast<const uint8_t*>(in);
  for (size_t j = 0; j < idx.size(); ++j) std::memcpy(out + j * es, src + idx[j] * es, es);
}

// Base of the compressors whose payload is m (index, value) pairs: indices u32 ascending, then
// the values in the input dtype. Subclasses choose the indices and bound m.
class PairCompressor : public EnvelopeCompressor {
 public:
  using EnvelopeCompressor::EnvelopeCompressor;

  CompressorTraits traits() const override {
    CompressorTraits t;
    t.biased = true;
    t.sparse = true;
    t.fixed_size = exact_pairs();
    return t;
  }

  size_t max_encoded_size(int64_t count, DType dtype) const override {
    if (count < 0) return kEnvelopeBytes;
    return kEnvelopeBytes + size_t(max_pairs(count)) * (4 + elem_size(dtype));
  }

  size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext& ctx, uint8_t* out,
                size_t capacity) const override {
    check_encode_args(in, count, capacity, 0, name_);
    check_index_count(count, name_, ": ");
    check_encode_args(in, count, capacity, max_encoded_size(count, dtype), name_);
    uint32_t param1 = 0;
    const std::vector<uint32_t> idx = select(in, dtype, count, ctx, &param1);
    const uint64_t m = idx.size();
    const uint64_t body_bytes = m * (4 + elem_size(dtype));
    uint8_t* body =
        begin_payload(in, dtype, count, capacity, body_bytes, 0, uint32_t(m), param1, out);
    if (m > 0) std::memcpy(body, idx.data(), m * 4);
    gather_values(in, dtype, idx, body + 4 * m);
    return kEnvelopeBytes + body_bytes;
  }

  void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
              bool add) const override {
    const Envelope e = open_payload(payload, size, out, count);
    CGX_CHECK_ARG(e.flags == 0, name_, " payload corrupt: unknown flags ", int(e.flags));
    check_index_count(e.count, name_, " payload corrupt: ");
    const uint64_t m = e.param0;
    const uint64_t limit = uint64_t(max_pairs(e.count));
    if (exact_pairs()) {
      CGX_CHECK_ARG(m == limit, name_, " payload corrupt: ", m, " pairs, expected ", limit, " for ",
                    e.count, " values");
    } else {
      CGX_CHECK_ARG(m <= limit, name_, " payload corrupt: ", m, " pairs, at most ", limit, " for ",
                    e.count, " values");
    }
    CGX_CHECK_ARG(e.body_bytes == m * (4 + elem_size(e.dtype)), name_, " payload corrupt: body of ",
                  e.body_bytes, " bytes for ", m, " pairs of ", dtype_name(e.dtype));
    const uint8_t* indices = payload + kEnvelopeBytes;
    const uint8_t* values = indices + 4 * m;
    for (uint64_t j = 0; j < m; ++j) {
      const uint32_t i = read_u32(indices, j);
      CGX_CHECK_ARG(int64_t(i) < e.count, name_, " payload corrupt: index ", i, " (pair ", j,
                    ") out of range for ", e.count, " values");
      CGX_CHECK_ARG(j == 0 || i > read_u32(indices, j - 1), name_, " payload corrupt: index ", i,
                    " (pair ", j,
                    ") not above the previous one (indices must be strictly "
                    "ascending)");
    }
    prim::clear(out, out_dtype, count, add);
    for (uint64_t j = 0; j < m; ++j) {
      prim::put_value(out, out_dtype, read_u32(indices, j), read_value(values, e.dtype, j), add);
    }
  }

 protected:
  // The indices to send, ascending, at most max_pairs(count); *param1 goes to the envelope.
  virtual std::vector<uint32_t> select(const void* in, DType dtype, int64_t count,
                                       const EncodeContext& ctx, uint32_t* param1) const = 0;
  // The most pairs a payload of `count` values holds (0 <= count <= 2^32 - 1).
  virtual int64_t max_pairs(int64_t count) const = 0;
  // Whether every payload holds exactly max_pairs(count) pairs (fixed size).
  virtual bool exact_pairs() const { return false; }
};

// Indices with magnitude >= thr, ascending: spans on the codec's pool, each collecting its own.
inline std::vector<uint32_t> select_at_least(const void* in, DType dtype, int64_t count,
                                             float thr) {
  auto parts = spans::map_spans<std::vector<uint32_t>>(count, 8, [&](int64_t lo, int64_t hi) {
    std::vector<uint32_t> part =
        prim::indices_at_least(spans::at(in, dtype, lo), dtype, hi - lo, thr);
    for (uint32_t& i : part) i += uint32_t(lo);
    return part;
  });
  if (parts.size() == 1) return std::move(parts[0]);
  size_t total = 0;
  for (const auto& part : parts) total += part.size();
  std::vector<uint32_t> idx;
  idx.reserve(total);
  for (const auto& part : parts) idx.insert(idx.end(), part.begin(), part.end());
  return idx;
}

// The sampled-threshold selection of dgc and graddrop (docs/FORMAT.md, "Sparse compressors"): about
// k of the largest magnitudes, never more than cap_for(k, count).
constexpr int64_t kMinSample = 1024;
inline int64_t cap_for(int64_t k, int64_t count) { return std::min(count, 2 * k); }

// prim::sampled_threshold, its sample drawn in spans on the codec's pool (the same value).
inline float sampled_threshold(const void* in, DType dtype, int64_t count, int64_t k,
                               int64_t sample, RngKey key) {
  if (count == 0 || k <= 0) return INFINITY;
  const int64_t s = prim::sample_size(count, sample);
  std::vector<float> m(static_cast<size_t>(s));
  spans::for_each_span(s, 1, [&](int64_t lo, int64_t hi) {
    prim::sample_magnitudes(in, dtype, count, sample, key, lo, hi, m.data() + lo);
  });
  return prim::sample_quantile(m.data(), s, count, k);
}

inline std::vector<uint32_t> sampled_select(const void* in, DType dtype, int64_t count, int64_t k,
                                            double sample_rate, const EncodeContext& ctx,
                                            uint32_t* param1) {
  if (count == 0) return {};
  const int64_t sample = std::max(count_for(sample_rate, count), std::min(count, kMinSample));
  const float thr = sampled_threshold(in, dtype, count, k, sample, rng_key(ctx.seed, ctx.stream));
  *param1 = float_bits(thr);
  std::vector<uint32_t> idx = select_at_least(in, dtype, count, thr);
  const int64_t cap = cap_for(k, count);
  if (int64_t(idx.size()) > cap) idx = prim::top_k(in, dtype, count, cap);
  return idx;
}

// A parameter that must be > 0 (ParamSpec ranges are closed).
inline void check_positive(const ParamValues& p, const char* compressor, const char* name) {
  CGX_CHECK_ARG(p.get(name) > 0, compressor, " parameter ", name, " must be in (0, 1], got ",
                p.get(name));
}

}  // namespace cgx::sparse
